// DDP's predicted memory and traffic (ddp.cpp runs it), with or without PyTorch's ZeroRedundancyOptimizer: a full
// replica on every rank, DDP's gradient buckets, and the optimizer over what this rank updates. At the recipe
// PyTorch keeps (with_framework_recipe: mixed is autocast over fp32 weights, so 4 + 4 + 4 + 8 = 20 bytes per
// parameter with the buckets and no master copy, where the ZeRO paper's mixed DDP has 16).
//
// Per rank, Ψ parameters, n_u per unit:
//   parameters  Ψ · parameter bytes
//   gradients   Σ_u n_u · gradient bytes, each unit's made in its backward and freed by zero_grad after the step
//               (all of them live at the step); with gradient_as_bucket_view Ψ · gradient bytes from set-up
//   buckets     Ψ · gradient bytes       (none with gradient_as_bucket_view: the gradients live in the buckets)
//   Adam moments per tensor updated, each as a shrunk run charges that tensor: every tensor under DDP; under
//               ZeroRedundancyOptimizer the whole tensors input.rank owns (buckets.h zero_redundancy_owners, over
//               the charged sizes, so that a shrunk run partitions as the full-scale one; a plan speaks for rank 0)
//   optimizer step  torch.optim.AdamW's temporaries (optim/step_temporaries.h) over those tensors: foreach their
//                   sum, single twice the largest, fused none, at the moments' dtype, counted with the optimizer state
// autocast's bf16 weight copies are saved activations (ddp.cpp), outside the model states predicted here.
// Traffic: the gradients all-reduced once per step (only the last micro-batch reduces), one call per bucket, at the
// gradients' dtype, or in bf16 under the bf16_compress_hook. ZeroRedundancyOptimizer then
// broadcasts every tensor from its owner: (N−1)/N of its bytes per call, the average over the ranks (a binomial
// tree's root sends more, its leaves nothing).
//
// zero0 (DeepSpeed without ZeRO, FP16_UnfusedOptimizer over torch AdamW; ddp.cpp) keeps DeepSpeed's recipe, bf16
// parameters and gradients with fp32 master copies, so (2 + 2 + 4 + 12)Ψ at step():
//   parameters  Ψ · 2
//   gradients   Σ_u n_u · 2, plus Ψ · 4 of fp32 copies made at step() beside them
//   buckets     the largest of DeepSpeed's all-reduce buckets (buckets.h deepspeed_allreduce_buckets: tensors in
//               registration order, as a shrunk run charges each, closed past 500,000,000 elements ÷ k²) at the
//               gradients' dtype: its flat copy
//   master, m, v over every tensor; foreach AdamW's temporaries as under DDP
// Traffic: one all-reduce per bucket, at the gradients' dtype.
#include "strategies/analytic.h"
#include "strategies/buckets.h"

#include <algorithm>

namespace emu::strategy {

Updated predict_ddp(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction) {
  const uint64_t parameters = input.parameter_count();
  const DType grads = options.recipe.grads;
  const int all = AnalyticInput::kAllUnits;
  const bool zero = options.kind == StrategyKind::kDdpZero;
  const bool deepspeed = options.kind == StrategyKind::kZero0;
  prediction.peak[Category::kParameters] = input.bytes(all, parameters, options.recipe.params);
  if (options.ddp.gradient_as_bucket_view && !deepspeed) {
    prediction.peak[Category::kGradients] = input.bytes(all, parameters, grads);
  } else {
    for (size_t u = 0; u < input.unit_counts.size(); ++u) {
      prediction.peak[Category::kGradients] += input.bytes(static_cast<int>(u), input.unit_counts[u], grads);
    }
    if (!deepspeed) prediction.peak[Category::kBuckets] = input.bytes(all, parameters, grads);
  }
  if (deepspeed && grads != DType::kF32) {  // FP16_UnfusedOptimizer's fp32 .grads at step()
    prediction.peak[Category::kGradients] += input.bytes(all, parameters, DType::kF32);
  }
  prediction.formula = zero        ? "(4 + 4 + 4 + 8/N)Ψ: a replica, DDP's buckets, AdamW on whole owned tensors"
                       : deepspeed ? "(2 + 2 + 4 + K)Ψ: a bf16 replica, fp32 gradient copies at step()"
                                   : "(2 + 2 + K)Ψ: a full replica";
  std::vector<uint64_t> tensors, charged;  // every parameter tensor, registration order: held, as charged
  for (size_t u = 0; u < input.unit_counts.size(); ++u) {
    const std::vector<uint64_t> held = input.tensors_of(u);
    tensors.insert(tensors.end(), held.begin(), held.end());
    const bool known = u < input.unit_tensors_charged.size();
    charged.insert(charged.end(), (known ? input.unit_tensors_charged[u] : held).begin(),
                   (known ? input.unit_tensors_charged[u] : held).end());
  }
  // One all-reduce per gradient bucket, as DDP's reducer launches them (buckets.h: the tensors' gradient bytes
  // against the first-bucket and bucket caps ÷ k², as ddp.cpp assigns them).
  const bool compressed = options.ddp.comm_hook == CommHook::kBf16 && grads == DType::kF32 && !deepspeed;
  if (deepspeed) {  // filled by the charged sizes, as ddp.cpp fills them; on the wire the tensors as held
    for (const std::vector<size_t>& bucket :
         deepspeed_allreduce_buckets(charged, options.scaled(kDeepSpeedAllreduceElements))) {
      uint64_t elements = 0, charged_elements = 0;
      for (const size_t i : bucket) {
        elements += tensors[i];
        charged_elements += charged[i];
      }
      add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "world", elements * dtype_size(grads),
                       input.world);
      prediction.peak[Category::kBuckets] =
          std::max(prediction.peak[Category::kBuckets], input.bytes(AnalyticInput::kCharged, charged_elements, grads));
    }
  }
  std::vector<size_t> gradient_bytes;
  gradient_bytes.reserve(tensors.size());
  for (const uint64_t n : tensors) gradient_bytes.push_back(n * dtype_size(grads));
  for (const Bucket& bucket : deepspeed ? std::vector<Bucket>()
                                        : assign_buckets(gradient_bytes, options.scaled(options.ddp.first_bucket_bytes),
                                                         options.scaled(options.ddp.bucket_bytes))) {
    uint64_t elements = 0;
    for (const size_t i : bucket.params) elements += tensors[i];
    add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "world",
                     elements * dtype_size(compressed ? DType::kBF16 : grads), input.world);
  }
  const std::vector<int> owners = zero_redundancy_owners(charged, input.world);
  uint64_t owned = 0, largest = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (zero) {
      add_ring_traffic(prediction, coll::CollectiveKind::kBroadcast, "world",
                       tensors[i] * dtype_size(options.recipe.params), input.world);
      if (owners[i] != input.rank) continue;
    }
    owned += charged[i];
    largest = std::max<uint64_t>(largest, charged[i]);
  }
  switch (options.adamw_impl) {  // torch.optim.AdamW over the tensors this rank updates
    case optim::AdamWImpl::kForeach: prediction.step_temporary_elements = owned; break;
    case optim::AdamWImpl::kSingle: prediction.step_temporary_elements = 2 * largest; break;
    case optim::AdamWImpl::kFused: break;
  }
  if (input.offload) prediction.pcie.device_to_host = owned * dtype_size(grads);
  return {{AnalyticInput::kCharged, owned}};
}

}  // namespace emu::strategy
