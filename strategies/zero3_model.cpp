// ZeRO-3's predicted memory and traffic (zero3.cpp runs it), after the ZeRO paper's (2 + 2 + K)Ψ/N plus the
// parameters DeepSpeed holds gathered.
//
// Every unit u of n_u elements is padded to P_u, a multiple of N, and partitioned into shards of P_u/N. Per rank:
//   parameters  Σ_u P_u/N, plus the units gathered at the peak of one step replayed as zero3.cpp runs it: the
//               root (gathered from the start of forward to the end of backward), every persistent unit (at most
//               stage3_param_persistence_threshold elements), the blocks in use or prefetched ahead of use
//               (stage3_prefetch_bucket_size newly fetched elements per fetch, stage3_max_live_parameters in all),
//               and the blocks kept from their forward to their backward, those whose reuse distance (analytic.h
//               reuse_distance) is below stage3_max_reuse_distance
//   gradients   Σ_u P_u/N (in host memory under offload), plus the more of: the largest tensor's .grad while
//               backward makes it (one at a time, each copied into the ipg bucket and dropped); step()'s largest
//               sub-group (units in order until sub_group_size elements of partition) flattened and cast to fp32,
//               S_g·(g + 4) (S_g·4 at fp32), none under offload
//   master weights and Adam moments over Σ_u P_u/N
//   buckets     the ipg reduce bucket, R = reduce_bucket_size elements at the gradients' dtype, all run (one, also
//               with overlap_comm)
// Traffic per micro-batch: each block all-gathered twice (forward and backward; once when kept for reuse), the
// root once, and every unit's
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

namespace emu::strategy {
namespace {

// Bytes of the units gathered at the peak beyond the shards, each charged as the strategy allocates it
// (AnalyticInput::bytes), from one step replayed at unit grain as zero3.cpp runs it: the root gathered when forward
// begins and released when backward ends; each block fetched before its forward and its backward and released
// after; on every fetch, the units that follow in the pass prefetched nearest first while the newly fetched
// elements fit in stage3_prefetch_bucket_size and all gathered ones under stage3_max_live_parameters, units
// already gathered passed over without counting (DeepSpeed's PartitionedParameterCoordinator consumes its trace
// queue the same way, so prefetching runs further ahead on every fetch); persistent units never released; blocks
// `reused` kept from their forward to their backward.
uint64_t gathered_at_peak(const StrategyOptions& options, const AnalyticInput& input, const UnitShards& shards,
                          const std::vector<bool>& persistent, const std::vector<bool>& reused) {
  const int last = static_cast<int>(shards.padded.size()) - 1;
  const auto unit_bytes = [&](int unit) {
    return input.bytes(unit, shards.padded[static_cast<size_t>(unit)], options.recipe.params);
  };
  // Elements as charged: what the full-scale limits ÷ k² are compared with.
  const auto charged = [&](int unit) { return input.elements(unit, shards.padded[static_cast<size_t>(unit)]); };
  const uint64_t prefetch_bucket = options.scaled(options.zero.prefetch_bucket_elements);
  const uint64_t max_live = options.scaled(options.zero.max_live_parameters);

  // The root split as zero3.cpp charges it: its data uncharged, the embedding and the head part charged apart.
  const RootSplit split = persistent[0] ? RootSplit{} : root_split(charged(0), input.embedding_elements);
  const uint64_t param_size = dtype_size(options.recipe.params);

  std::vector<bool> live(shards.padded.size(), false);
  uint64_t live_elements = 0, live_bytes = 0, peak = 0;
  const auto gather = [&](int unit) {
    if (live[static_cast<size_t>(unit)]) return;
    live[static_cast<size_t>(unit)] = true;
    if (unit == 0 && split.embedding > 0) return;  // charged part by part (hold)
    live_elements += charged(unit);
    live_bytes += unit_bytes(unit);
    peak = std::max(peak, live_bytes);
  };
  const auto release = [&](int unit) {
    if (!live[static_cast<size_t>(unit)] || persistent[static_cast<size_t>(unit)]) return;
    live[static_cast<size_t>(unit)] = false;
    live_elements -= charged(unit);
    live_bytes -= unit_bytes(unit);
  };
  bool embedding_held = false, head_held = false;
  const auto hold = [&](bool& held, uint64_t elements, bool on) {
    if (split.embedding == 0 || held == on) return;
    held = on;
    live_elements = on ? live_elements + elements : live_elements - elements;
    live_bytes = on ? live_bytes + elements * param_size : live_bytes - elements * param_size;
    peak = std::max(peak, live_bytes);
  };
  const auto prefetch = [&](int from, int to, int direction) {
    uint64_t fetched = 0;
    for (int next = from; next != to + direction; next += direction) {
      if (live[static_cast<size_t>(next)]) continue;
      const uint64_t count = charged(next);
      if (fetched + count > prefetch_bucket || live_elements + count > max_live) break;
      gather(next);
      fetched += count;
    }
  };
  gather(0);
  hold(embedding_held, split.embedding, true);
  for (int unit = 1; unit <= last; ++unit) {  // forward
    if (unit == 1 && !reused[0]) hold(embedding_held, split.embedding, false);
    gather(unit);
    if (unit < last) prefetch(unit + 1, last, +1);
    if (!reused[static_cast<size_t>(unit)]) release(unit);
  }
  hold(head_held, split.head, true);          // the final norm and the head, through their backward
  if (last >= 1) prefetch(last, 1, -1);       // the head's backward prefetches the last blocks
  for (int unit = last; unit >= 1; --unit) {  // backward
    if (unit == last) hold(head_held, split.head, false);
    gather(unit);
    if (unit > 1) prefetch(unit - 1, 1, -1);
    release(unit);
  }
  hold(embedding_held, split.embedding, true);  // the embedding's backward
  return peak;
}

// Elements (as charged) of the largest of step()'s sub-groups: units in order, a sub-group closed once it holds
// sub_group_size elements.
uint64_t largest_sub_group(const StrategyOptions& options, const AnalyticInput& input, const UnitShards& shards) {
  const uint64_t limit = options.scaled(options.zero.sub_group_size);
  uint64_t largest = 0, held = 0;
  for (size_t unit = 0; unit < shards.padded.size(); ++unit) {
    held += input.elements(static_cast<int>(unit), shards.padded[unit] / static_cast<uint64_t>(shards.group_size));
    if (held >= limit || unit + 1 == shards.padded.size()) {
      largest = std::max(largest, held);
      held = 0;
    }
  }
  return largest;
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

  // Blocks kept gathered from forward to backward: their reuse distance below stage3_max_reuse_distance.
  std::vector<uint64_t> unit_elements(units);
  for (size_t unit = 0; unit < units; ++unit) {
    unit_elements[unit] = input.elements(static_cast<int>(unit), input.unit_counts[unit]);
  }
  std::vector<bool> reused(units, false);  // [0]: the embedding, kept from its forward to its backward
  for (size_t unit = 0; unit < units; ++unit) {
    reused[unit] = reuse_distance(unit_elements, input.head_elements, static_cast<int>(unit)) <
                   options.scaled(options.zero.max_reuse_distance);
  }

  const bool offload_param = options.zero.offload_param;
  const uint64_t gathered =
      world > 1 || offload_param ? gathered_at_peak(options, input, shards, persistent, reused) : 0;
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
      input.offload ? 0
                    : largest_sub_group(options, input, shards) * (grads == DType::kF32 ? 4 : dtype_size(grads) + 4);
  prediction.peak[Category::kGradients] = (input.offload ? 0 : gradient_shards) + std::max(in_backward, at_step);
  if (options.zero.torch_adam) {  // torch.optim.AdamW over one sub-group's flat fp32 partition at a time
    const uint64_t sub_group = largest_sub_group(options, input, shards);
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
    // The root and the blocks kept for reuse stay gathered between forward and backward; a persistent unit is
    // gathered once per step.
    const uint64_t gathers = persistent[unit] ? 1 : micro_batches * (unit != 0 && !reused[unit] ? 2 : 1);
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
