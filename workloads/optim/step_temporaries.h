// What torch.optim.AdamW allocates beyond its state while step() runs, by implementation (torch/optim/adam.py,
// which AdamW runs with decoupled weight decay):
//
//   foreach  _multi_tensor_adam: the moments are updated in place (_foreach_lerp_, _foreach_mul_, _foreach_addcmul_),
//            then exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs) is a new tensor per parameter at the state's dtype,
//            all alive until the parameters are updated: Σ n_i elements. PyTorch's default on a GPU.
//   single   _single_tensor_adam: per parameter, denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt) holds the sqrt
//            and the quotient at once, one parameter at a time: 2·max n_i elements at the peak.
//   fused    _fused_adamw_: one kernel per group, no temporaries.
//
// n_i are the tensors the optimizer steps over on this rank: every parameter under DDP, each unit's local flat
// shard under FSDP (use_orig_params=False). DeepSpeed's ZeRO optimizers are not torch.optim.AdamW.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "emu/device.h"

namespace emu::optim {

enum class AdamWImpl : uint8_t { kForeach, kFused, kSingle };
std::string_view adamw_impl_name(AdamWImpl impl);
std::vector<std::string> adamw_impl_names();  // in the order of the enum

// Charges one step's temporaries on `device` (the optimizer's: the host under offload) for as long as it lives, to
// Category::kOptimizerState, where PyTorch's memory tracker counts the optimizer's step. `tensor_elements`: n_i;
// `state_dtype`: the dtype of exp_avg_sq.
class StepTemporaries {
 public:
  StepTemporaries(Device& device, AdamWImpl impl, std::span<const uint64_t> tensor_elements, DType state_dtype);

 private:
  std::vector<Buffer> buffers_;
};

}  // namespace emu::optim
