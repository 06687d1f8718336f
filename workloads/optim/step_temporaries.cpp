#include "workloads/optim/step_temporaries.h"

#include <algorithm>

namespace emu::optim {

std::string_view adamw_impl_name(AdamWImpl impl) {
  switch (impl) {
    case AdamWImpl::kForeach: return "foreach";
    case AdamWImpl::kFused: return "fused";
    case AdamWImpl::kSingle: return "single";
  }
  return "?";
}

std::vector<std::string> adamw_impl_names() { return {"foreach", "fused", "single"}; }

StepTemporaries::StepTemporaries(Device& device, AdamWImpl impl, std::span<const uint64_t> tensor_elements,
                                 DType state_dtype) {
  if (tensor_elements.empty() || impl == AdamWImpl::kFused) return;
  if (impl == AdamWImpl::kForeach) {
    buffers_.reserve(tensor_elements.size());
    for (uint64_t n : tensor_elements) {
      buffers_.push_back(device.allocate(n, state_dtype, Category::kOptimizerState, "foreach AdamW exp_avg_sq.sqrt()"));
    }
    return;
  }
  // The for-loop's peak, charged for the step: the largest parameter's sqrt and quotient.
  const uint64_t largest = *std::max_element(tensor_elements.begin(), tensor_elements.end());
  buffers_.push_back(device.allocate(largest, state_dtype, Category::kOptimizerState, "AdamW exp_avg_sq.sqrt()"));
  buffers_.push_back(
      device.allocate(largest, state_dtype, Category::kOptimizerState, "AdamW sqrt / bias_correction2_sqrt"));
}

}  // namespace emu::optim
