#include "workloads/optim/precision.h"

#include <fmt/format.h>

#include "emu/check.h"

namespace emu::optim {

std::string_view PrecisionRecipe::name() const {
  switch (recipe) {
    case Recipe::kMixed: return "mixed";
    case Recipe::kPureBf16: return "bf16";
    case Recipe::kFp32: return "fp32";
  }
  return "unknown";
}

uint64_t PrecisionRecipe::bytes_per_param(Category category) const {
  switch (category) {
    case Category::kParameters: return dtype_size(params);
    case Category::kGradients: return dtype_size(grads);
    case Category::kMasterWeights: return has_master ? dtype_size(DType::kF32) : 0;
    case Category::kOptimizerState: return 2 * dtype_size(moments);
    default: return 0;
  }
}

uint64_t PrecisionRecipe::total_bytes_per_param() const {
  return bytes_per_param(Category::kParameters) + bytes_per_param(Category::kGradients) + optimizer_bytes_per_param();
}

uint64_t PrecisionRecipe::optimizer_bytes_per_param() const {
  return bytes_per_param(Category::kMasterWeights) + bytes_per_param(Category::kOptimizerState);
}

PrecisionRecipe precision_recipe(Recipe recipe) {
  switch (recipe) {
    case Recipe::kMixed: return {Recipe::kMixed, DType::kBF16, DType::kBF16, true, DType::kF32};
    case Recipe::kPureBf16: return {Recipe::kPureBf16, DType::kBF16, DType::kBF16, false, DType::kBF16};
    case Recipe::kFp32: return {Recipe::kFp32, DType::kF32, DType::kF32, false, DType::kF32};
  }
  return {};
}

PrecisionRecipe parse_precision_recipe(std::string_view name) {
  if (name == "mixed") return precision_recipe(Recipe::kMixed);
  if (name == "bf16") return precision_recipe(Recipe::kPureBf16);
  if (name == "fp32") return precision_recipe(Recipe::kFp32);
  throw InputError(
      fmt::format("unknown precision recipe '{}': expected mixed (bf16 compute, fp32 master and "
                  "moments, 16 B/param), bf16 (8 B/param) or fp32 (16 B/param)",
                  name));
}

}  // namespace emu::optim
