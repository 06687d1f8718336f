// DDP's predicted memory and traffic (ddp.cpp runs it): a full replica on every rank, so the ZeRO paper's
// baseline (2 + 2 + K)Ψ, plus DDP's gradient buckets.
//
// Per rank, Ψ parameters:
//   parameters  Ψ · parameter bytes      gradients  Ψ · gradient bytes
//   buckets     Ψ · gradient bytes       (none with gradient_as_bucket_view: the gradients live in the buckets)
//   master weights and Adam moments over all Ψ
//   optimizer step  torch.optim.AdamW's temporaries (optim/step_temporaries.h): foreach Ψ, single twice the
//                   largest parameter, fused none, at the moments' dtype, counted with the optimizer state
// Traffic: the gradients all-reduced once per step (only the last micro-batch reduces); the bucket count does
// not change the volume.
#include "strategies/analytic.h"

namespace emu::strategy {

Updated predict_ddp(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction) {
  const uint64_t parameters = input.parameter_count();
  const uint64_t grad_bytes = dtype_size(options.recipe.grads);
  const int all = AnalyticInput::kAllUnits;
  prediction.peak[Category::kParameters] = input.bytes(all, parameters, options.recipe.params);
  prediction.peak[Category::kGradients] = input.bytes(all, parameters, options.recipe.grads);
  if (!options.ddp.gradient_as_bucket_view) {
    prediction.peak[Category::kBuckets] = input.bytes(all, parameters, options.recipe.grads);
  }
  prediction.formula = "(2 + 2 + K)Ψ: a full replica";
  add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "world", parameters * grad_bytes, input.world);
  switch (options.adamw_impl) {  // torch.optim.AdamW over every parameter tensor
    case optim::AdamWImpl::kForeach: prediction.step_temporary_elements = input.parameter_tensors_charged; break;
    case optim::AdamWImpl::kSingle: prediction.step_temporary_elements = 2 * input.largest_parameter_charged; break;
    case optim::AdamWImpl::kFused: break;
  }
  if (input.offload) prediction.pcie.device_to_host = input.bytes(all, parameters, options.recipe.grads);
  return {{all, parameters}};
}

}  // namespace emu::strategy
