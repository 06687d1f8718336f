// ZeRO-3's predicted memory and traffic (zero3.cpp runs it), after the ZeRO paper's (2 + 2 + K)Ψ/N plus the
// parameters DeepSpeed holds gathered.
//
// Every unit u of n_u elements is padded to P_u, a multiple of N, and partitioned into shards of P_u/N. Per rank:
//   parameters  Σ_u P_u/N, plus the most DeepSpeed holds gathered at once, its coordinator's trace replayed
//               tensor by tensor as zero3.cpp charges it (zero3_modules.h: fetch, prefetch within
//               stage3_prefetch_bucket_size and stage3_max_live_parameters, release unless persistent or used
//               again within stage3_max_reuse_distance), over the first micro-batch and, with accumulation, a
//               later one
//   gradients   Σ_u P_u/N (in host memory under offload), plus the more of: the largest tensor's .grad while
//               backward makes it (one at a time, each copied into the ipg bucket and dropped); step()'s largest
//               sub-group (tensors in registration order, each partitioned on its own, until sub_group_size
//               elements of partition: shard.h sub_group_partitions) flattened and cast to fp32,
//               S_g·(g + 4) (S_g·4 at fp32), none under offload
//   master weights and Adam moments over Σ_u P_u/N
//   buckets     the ipg reduce bucket, R = reduce_bucket_size elements at the gradients' dtype, all run (one, also
//               with overlap_comm)
// Traffic per micro-batch: each block all-gathered whole twice (forward and backward; once when DeepSpeed keeps
// every tensor of it between them), the root once, and every unit's
// gradients reduce-scattered; a persistent unit is all-gathered once per step (after the optimizer step), and the
// gradient norm all-reduced once.
// Over TP (--tp T): n_u is the rank's TP slice of unit u and N the D = N/T ranks of its "data-parallel" group, where
// the traffic above runs; tp's activation all-reduces run in the "tensor-parallel" group, and the gradient norm is
// all-reduced there once more.
// offload_param: the parameter partitions Σ_u P_u/N in host memory instead; each all-gather above copies its
// partition up over PCIe first, and the step sends the updated partitions down (unless the optimizer, offloaded
// too, updates them on the host).
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "strategies/analytic.h"
#include "strategies/zero3_modules.h"

namespace emu::strategy {
namespace {

// Elements (as charged) of the largest of step()'s sub-groups (shard.h sub_group_partitions) over `ranks`.
uint64_t largest_sub_group(const StrategyOptions& options, const AnalyticInput& input, int ranks) {
  const std::vector<uint64_t> groups =
      sub_group_partitions(input.registration_order(), ranks, options.scaled(options.zero.sub_group_size),
                           static_cast<uint64_t>(input.shrink));
  return groups.empty() ? 0 : *std::max_element(groups.begin(), groups.end());
}

}  // namespace

Updated predict_zero3(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction) {
  // Over TP (--tp T): the input's units are the rank's slices, partitioned over the D replicas (N reads D).
  const ShardedLayout layout = sharded_layout(options, input, prediction);
  const int world = layout.mesh.data;
  const UnitShards shards = unit_shards(input, world);
  const size_t units = input.unit_counts.size();
  const uint64_t param_bytes = dtype_size(options.recipe.params);
  const uint64_t grad_bytes = dtype_size(options.recipe.grads);
  std::vector<bool> persistent(units, false);
  for (size_t unit = 0; unit < units; ++unit) {
    persistent[unit] = input.elements(static_cast<int>(unit), input.unit_counts[unit]) <=
                       options.scaled(options.zero.param_persistence_threshold);
  }

  // DeepSpeed's coordinator replayed tensor by tensor (zero3_modules.h): the first micro-batch after the optimizer
  // step, and the later ones, which begin with the persistent tensors gathered.
  const Zero3ModuleInput modules = zero3_module_input(options, input);
  const Zero3Phases first = zero3_module_phases(modules, false);
  const Zero3Phases later = zero3_module_phases(modules, true);
  const bool offload_param = options.zero.offload_param;
  const uint64_t gathered_elements = std::max(first.max(), input.accumulation > 1 ? later.max() : 0);
  const uint64_t gathered = world > 1 || offload_param ? gathered_elements * param_bytes : 0;
  const DType grads = options.recipe.grads;
  const uint64_t gradient_shards = shards.shard_bytes(input, grads);
  const uint64_t parameter_shards = shards.shard_bytes(input, options.recipe.params);
  prediction.peak[Category::kParameters] = (offload_param ? 0 : parameter_shards) + gathered;
  // Backward: one parameter's .grad at a time, before DeepSpeed copies it into the ipg bucket: the largest tensor.
  // step(): the largest sub-group's flattened gradients and their fp32 copy (at fp32 one buffer), on the device
  // unless the optimizer is offloaded.
  uint64_t largest_tensor = 0;
  for (size_t unit = 0; unit < units; ++unit) {
    const std::vector<uint64_t> tensors =
        input.unit_tensors_charged.empty() ? input.tensors_of(unit) : input.unit_tensors_charged[unit];
    for (uint64_t tensor : tensors) largest_tensor = std::max(largest_tensor, tensor);
  }
  const uint64_t in_backward = largest_tensor * grad_bytes;
  const uint64_t at_step =
      input.offload ? 0 : largest_sub_group(options, input, world) * (grads == DType::kF32 ? 4 : dtype_size(grads) + 4);
  prediction.peak[Category::kGradients] = (input.offload ? 0 : gradient_shards) + std::max(in_backward, at_step);
  if (options.zero.torch_adam) {  // torch.optim.AdamW over one sub-group's flat fp32 partition at a time
    const uint64_t sub_group = largest_sub_group(options, input, world);
    if (options.adamw_impl == optim::AdamWImpl::kForeach) prediction.step_temporary_elements = sub_group;
    if (options.adamw_impl == optim::AdamWImpl::kSingle) prediction.step_temporary_elements = 2 * sub_group;
  }
  if (input.offload) {  // the gradient partitions in host memory, sent down every step
    prediction.host_peak[Category::kGradients] = gradient_shards;
    prediction.pcie.device_to_host = gradient_shards;
  }
  if (offload_param) {  // the partitions in host memory; the updated ones sent down unless updated there
    prediction.host_peak[Category::kParameters] = parameter_shards;
    if (!input.offload) prediction.pcie.device_to_host += parameter_shards;
  }
  // The ipg bucket: reduce_bucket_size ÷ k² elements, charged as held, whole run.
  prediction.peak[Category::kBuckets] = options.scaled(options.zero.reduce_bucket_elements) * grad_bytes;
  prediction.formula = layout.mesh.tensor > 1 ? fmt::format(
                                                    "(2 + 2 + K)Ψ/(t·D), t = {}, D = {}: the TP slices "
                                                    "partitioned over the data-parallel group",
                                                    layout.mesh.tensor, layout.mesh.data)
                                              : "(2 + 2 + K)Ψ/N: everything partitioned";

  const uint64_t micro_batches = static_cast<uint64_t>(input.accumulation);
  for (size_t unit = 0; unit < units; ++unit) {
    const uint64_t unit_param_bytes = shards.padded[unit] * param_bytes;
    // The root stays gathered from forward to backward, and so does a block DeepSpeed keeps whole; a persistent
    // unit is gathered once per step.
    const auto per_micro_batch = [&](const Zero3Phases& phases) { return unit != 0 && !phases.kept[unit] ? 2 : 1; };
    const uint64_t gathers =
        persistent[unit] ? 1 : per_micro_batch(first) + (micro_batches - 1) * per_micro_batch(later);
    add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, layout.group, unit_param_bytes, world, gathers);
    if (offload_param) {  // each fetch copies the partition up first
      prediction.pcie.host_to_device +=
          gathers * input.bytes(static_cast<int>(unit), shards.padded[unit] / static_cast<uint64_t>(world),
                                options.recipe.params);
    }
    add_ring_traffic(prediction, coll::CollectiveKind::kReduceScatter, layout.group, shards.padded[unit] * grad_bytes,
                     world, micro_batches);
  }
  add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, layout.group, 4,
                   world);  // the gradient norm's partial sums
  return shards.updated();
}

}  // namespace emu::strategy
