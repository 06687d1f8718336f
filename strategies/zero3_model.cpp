// ZeRO-3's predicted memory and traffic (zero3.cpp runs it), after the ZeRO paper's (2 + 2 + K)Ψ/N plus the
// parameters DeepSpeed holds gathered.
//
// Every unit u of n_u elements is padded to P_u, a multiple of N, and partitioned into shards of P_u/N. Per rank:
//   parameters  Σ_u P_u/N, plus the units gathered at the peak: the root (gathered from the start of forward to
//               the end of backward), every persistent unit (at most stage3_param_persistence_threshold
//               elements), and the widest window of blocks in use: a block plus the blocks prefetched after it
//               while they fit in stage3_prefetch_bucket_size and under stage3_max_live_parameters
//   gradients   Σ_u P_u/N (in host memory under offload), plus the root's and the largest block's gathered
//               gradients while backward makes them
//   master weights and Adam moments over Σ_u P_u/N
// Traffic per micro-batch: each block all-gathered twice (forward and backward), the root once, and every unit's
// gradients reduce-scattered; a persistent unit is all-gathered once per step (after the optimizer step), and the
// gradient norm all-reduced once.
#include <algorithm>
#include <vector>

#include "strategies/analytic.h"

namespace emu::strategy {
namespace {

// Elements gathered at the peak beyond the shards: the root and the persistent units throughout, plus the widest
// window of blocks gathered at once.
// Bytes of gathered units at the peak, each charged as the strategy allocates it (AnalyticInput::bytes).
uint64_t gathered_at_peak(const StrategyOptions& options, const AnalyticInput& input, const UnitShards& shards,
                          const std::vector<bool>& persistent) {
  const auto unit_bytes = [&](size_t unit) {
    return input.bytes(static_cast<int>(unit), shards.padded[unit], options.recipe.params);
  };
  // Elements as charged: what the full-scale limits ÷ k² are compared with.
  const auto charged = [&](size_t unit) { return input.elements(static_cast<int>(unit), shards.padded[unit]); };
  uint64_t always_gathered = charged(0);
  uint64_t always_bytes = unit_bytes(0);
  for (size_t unit = 1; unit < shards.padded.size(); ++unit) {
    if (persistent[unit]) {
      always_gathered += charged(unit);
      always_bytes += unit_bytes(unit);
    }
  }
  // The blocks' padded sizes, 0 for a persistent block (counted above, never fetched again within a step).
  std::vector<uint64_t> blocks;
  for (size_t unit = 1; unit < shards.padded.size(); ++unit) {
    blocks.push_back(persistent[unit] ? 0 : charged(unit));
  }

  const uint64_t prefetch_bucket = options.scaled(options.zero.prefetch_bucket_elements);
  const uint64_t max_live = options.scaled(options.zero.max_live_parameters);
  uint64_t widest_window = 0;  // bytes
  for (size_t current = 0; current < blocks.size(); ++current) {
    uint64_t prefetched = 0;
    uint64_t window = blocks[current];
    uint64_t window_bytes = blocks[current] == 0 ? 0 : unit_bytes(current + 1);
    for (size_t ahead = current + 1; ahead < blocks.size(); ++ahead) {
      if (blocks[ahead] == 0) continue;
      if (prefetched + blocks[ahead] > prefetch_bucket || always_gathered + window + blocks[ahead] > max_live) break;
      prefetched += blocks[ahead];
      window += blocks[ahead];
      window_bytes += unit_bytes(ahead + 1);
    }
    widest_window = std::max(widest_window, window_bytes);
  }
  return always_bytes + widest_window;
}

}  // namespace

Updated predict_zero3(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction) {
  const int world = input.world;
  const UnitShards shards = unit_shards(input, world);
  const size_t units = input.unit_counts.size();
  const uint64_t param_bytes = dtype_size(options.recipe.params);
  const uint64_t grad_bytes = dtype_size(options.recipe.grads);
  std::vector<bool> persistent(units, false);
  for (size_t unit = 0; unit < units; ++unit) {
    persistent[unit] = input.elements(static_cast<int>(unit), input.unit_counts[unit]) <=
                       options.scaled(options.zero.param_persistence_threshold);
  }

  const uint64_t gathered = world > 1 ? gathered_at_peak(options, input, shards, persistent) : 0;
  const DType grads = options.recipe.grads;
  const uint64_t gradient_shards = shards.shard_bytes(input, grads);
  prediction.peak[Category::kParameters] = shards.shard_bytes(input, options.recipe.params) + gathered;
  prediction.peak[Category::kGradients] = (input.offload ? 0 : gradient_shards) +
                                          input.bytes(0, shards.padded[0], grads) +
                                          input.bytes(shards.largest_block, shards.largest_padded_block, grads);
  if (input.offload) {  // the gradient partitions in host memory, sent down every step
    prediction.host_peak[Category::kGradients] = gradient_shards;
    prediction.pcie.device_to_host = gradient_shards;
  }
  prediction.formula = "(2 + 2 + K)Ψ/N: everything partitioned";

  const uint64_t micro_batches = static_cast<uint64_t>(input.accumulation);
  for (size_t unit = 0; unit < units; ++unit) {
    const uint64_t unit_param_bytes = shards.padded[unit] * param_bytes;
    if (persistent[unit]) {
      add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, "world", unit_param_bytes, world, 1);
    } else {
      const uint64_t gathers = unit != 0 ? 2 : 1;  // the root stays gathered between forward and backward
      add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, "world", unit_param_bytes, world,
                       micro_batches * gathers);
    }
    add_ring_traffic(prediction, coll::CollectiveKind::kReduceScatter, "world", shards.padded[unit] * grad_bytes, world,
                     micro_batches);
  }
  add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "world", 4,
                   world);  // the gradient norm's partial sums
  return shards.updated();
}

}  // namespace emu::strategy
