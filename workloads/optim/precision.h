// Precision recipes: which dtype each kind of model state has, and so how many bytes a parameter costs.
//
//   recipe  | parameters | gradients | master weights | optimizer state (m, v) | total | K (ZeRO paper)
//   mixed   | bf16  2    | bf16  2   | fp32  4        | fp32  4 + 4            | 16    | 12
//   bf16    | bf16  2    | bf16  2   | none  0        | bf16  2 + 2            |  8    |  4
//   fp32    | fp32  4    | fp32  4   | none  0        | fp32  4 + 4            | 16    |  8
//
// In the mixed recipe the optimizer updates the fp32 master weights and writes a bf16 copy into the parameters
// the model computes with. In the bf16 and fp32 recipes the parameters are the weights the optimizer updates.
// K is the ZeRO paper's optimizer-state multiplier: master weights plus moments, the part ZeRO-1 shards.
#pragma once

#include <cstdint>
#include <string_view>

#include "emu/dtype.h"
#include "emu/memory.h"

namespace emu::optim {

enum class Recipe : uint8_t { kMixed, kPureBf16, kFp32 };

struct PrecisionRecipe {
  Recipe recipe = Recipe::kMixed;
  DType params = DType::kBF16;  // the weights forward and backward compute with
  DType grads = DType::kBF16;
  bool has_master = true;       // a separate fp32 copy of the weights, updated by the optimizer
  DType moments = DType::kF32;  // Adam's m and v
  // A DeepSpeed fp16 config: the 2-byte weights and gradients are fp16, as the user set, with the same bytes as
  // bf16; emu computes them in bf16, and DeepSpeed's dynamic loss scaler holds scalars only.
  bool fp16 = false;
  std::string_view half_name() const { return fp16 ? "fp16" : "bf16"; }

  std::string_view name() const;
  // Bytes per parameter charged to `category`: kParameters, kGradients, kMasterWeights or kOptimizerState
  // (m and v together); 0 for any other category.
  uint64_t bytes_per_param(Category category) const;
  // Parameters + gradients + master weights + optimizer state.
  uint64_t total_bytes_per_param() const;
  // Master weights + optimizer state: the ZeRO paper's K.
  uint64_t optimizer_bytes_per_param() const;
};

PrecisionRecipe precision_recipe(Recipe recipe);
// "mixed", "bf16" or "fp32"; InputError naming the accepted values otherwise.
PrecisionRecipe parse_precision_recipe(std::string_view name);

}  // namespace emu::optim
