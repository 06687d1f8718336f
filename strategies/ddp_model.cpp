// DDP's predicted memory and traffic (ddp.cpp runs it): a full replica on every rank, so the ZeRO paper's
// baseline (2 + 2 + K)Ψ, plus DDP's gradient buckets.
//
// Per rank, Ψ parameters:
//   parameters  Ψ · parameter bytes      gradients  Ψ · gradient bytes
//   buckets     Ψ · gradient bytes       (none with gradient_as_bucket_view: the gradients live in the buckets)
//   master weights and Adam moments over all Ψ
// Traffic: the gradients all-reduced once per step (only the last micro-batch reduces); the bucket count does
// not change the volume.
#include "strategies/analytic.h"

namespace emu::strategy {

uint64_t predict_ddp(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction) {
  const uint64_t parameters = input.parameter_count();
  const uint64_t param_bytes = dtype_size(options.recipe.params);
  const uint64_t grad_bytes = dtype_size(options.recipe.grads);
  prediction.peak[Category::kParameters] = parameters * param_bytes;
  prediction.peak[Category::kGradients] = parameters * grad_bytes;
  if (!options.ddp.gradient_as_bucket_view) prediction.peak[Category::kBuckets] = parameters * grad_bytes;
  prediction.formula = "(2 + 2 + K)Ψ: a full replica";
  add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "world", parameters * grad_bytes, input.world);
  if (input.offload) prediction.pcie.device_to_host = parameters * grad_bytes;
  return parameters;
}

}  // namespace emu::strategy
