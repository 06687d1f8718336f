// FSDP's predicted memory and traffic (fsdp.cpp runs it), after the ZeRO paper's (2 + 2 + K)Ψ/M over a shard
// group of M ranks, plus the units FSDP holds gathered.
//
// M is the world for FULL_SHARD and SHARD_GRAD_OP, one rank for NO_SHARD, a node's ranks for HYBRID_SHARD. Every
// unit u of n_u elements is padded to P_u, a multiple of M, and sharded into P_u/M elements. Per rank:
//   parameters  Σ_u P_u/M (none in the mixed recipe when M > 1: the fp32 flat shard is the master), plus the
//               units gathered at the peak (none when M = 1): the root (not resharded between forward and
//               backward) and the widest window of blocks: every block for SHARD_GRAD_OP, else a block and the next
//               one with BACKWARD_PRE or forward prefetch, one without or with BACKWARD_POST (which gathers the
//               next once the unit is freed); in the mixed recipe plus
//               the bf16 shard (P_b/M) of the block whose all-gather completes the window (FSDP1's _mp_shard), or
//               the root's (P_0/M) while the root is gathered alone, whichever is more
//   gradients   Σ_u P_u/M at 4 bytes in the mixed recipe (FSDP's fp32 gradient shards), else at gradient bytes,
//               each made by its unit's first reduce-scatter and freed after the step (in host memory from set-up
//               under offload), plus the unsharded gradients while backward makes them: the root's head and final
//               norm part from the start of backward beside each block's, then the whole root; each unit's
//               parameters' gradients beside their concatenation into the FlatParameter's .grad, then that beside
//               its reduce-scatter output (gradient_peak)
//   master weights and Adam moments over Σ_u P_u/M
//   optimizer step  torch.optim.AdamW's temporaries over the units' flat shards: foreach Σ_u P_u/M, single
//                   twice the largest P_u/M, fused none, at the moments' dtype, counted with the optimizer state
// Traffic per micro-batch, in the shard group: each block all-gathered twice (once for SHARD_GRAD_OP), the root
// once, every unit's gradients reduce-scattered, and with HYBRID_SHARD each reduced shard all-reduced across the
// N/M replicas; once per step the gradient norm all-reduced.
// Over TP (--tp T): n_u is the rank's TP slice of unit u and N the D = N/T ranks of its "data-parallel" group, where
// the traffic above runs; tp's activation all-reduces run in the "tensor-parallel" group, and the gradient norm is
// all-reduced there once more.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "strategies/analytic.h"

namespace emu::strategy {
namespace {

// M, the ranks one unit is sharded over, of the `replicas` data-parallel ones (the world, or over TP its D).
int shard_group_size(Sharding sharding, const AnalyticInput& input, int replicas) {
  if (sharding == Sharding::kNoShard) return 1;
  if (sharding == Sharding::kHybridShard) return input.ranks_per_node;
  return replicas;
}

// Bytes gathered at the peak beyond the kept shards, each buffer charged as the strategy allocates it
// (AnalyticInput::bytes): the root, plus the widest window of blocks gathered at once; with `transient_shard` (no
// kept parameter shard), plus the low-precision shard of the unit being gathered.
uint64_t gathered_at_peak(const StrategyOptions& options, const AnalyticInput& input, const UnitShards& shards,
                          bool transient_shard) {
  const FsdpOptions& fsdp = options.fsdp;
  const DType params = options.recipe.params;
  std::vector<uint64_t> blocks;  // [L] bytes of each gathered block
  for (size_t unit = 1; unit < shards.padded.size(); ++unit) {
    blocks.push_back(input.bytes(static_cast<int>(unit), shards.padded[unit], params));
  }
  uint64_t widest_window = 0;
  if (fsdp.sharding == Sharding::kShardGradOp) {
    widest_window = std::accumulate(blocks.begin(), blocks.end(), uint64_t{0});
  } else {
    // BACKWARD_POST gathers the next block once this one is freed (_post_backward_reshard): one at a time.
    const bool prefetch = fsdp.backward_prefetch == BackwardPrefetch::kPre || fsdp.forward_prefetch;
    for (size_t block = 0; block < blocks.size(); ++block) {
      const uint64_t next = prefetch && block + 1 < blocks.size() ? blocks[block + 1] : 0;
      widest_window = std::max(widest_window, blocks[block] + next);
    }
  }
  const uint64_t root = input.bytes(0, shards.padded[0], params);
  if (!transient_shard) return root + widest_window;
  const auto m = static_cast<uint64_t>(shards.group_size);
  const uint64_t root_shard = input.bytes(0, shards.padded[0] / m, params);
  const uint64_t block_shard = input.bytes(shards.largest_block, shards.largest_padded_block / m, params);
  return root + std::max(root_shard, widest_window + block_shard);
}

// The gradients' peak over backward, each unit's as FSDP1 makes them (fsdp.cpp). A block's parameters' gradients
// grow tensor by tensor to n_u during its backward, then sit beside their concatenation, the FlatParameter's .grad
// (n_u), for a moment (the block's peak); that alone is then reduce-scattered, beside a P_u/M output at the
// gradient dtype unless that output is the sharded gradient itself (the step's first at the shard's dtype, on the
// device), and the reduce-scatter makes the unit's sharded gradient (fp32 in the
// mixed recipe) when it is this step's first. The root's unsharded gradients: the head's and the final norm's part
// (`head`) beside every block's, the whole root once backward reaches the embeddings, then concatenated and reduced
// likewise, last. Sharded gradients stay until the optimizer step: in the first micro-batch only the units reduced
// so far have one; with gradient accumulation every unit has one from the second micro-batch on. Under CPUOffload
// they are the host's.
uint64_t gradient_peak(const AnalyticInput& input, const UnitShards& shards, DType grads, DType shard_grads) {
  const auto m = static_cast<uint64_t>(shards.group_size);
  const bool accumulating = input.accumulation > 1;
  std::vector<uint64_t> shard(shards.padded.size(), 0);  // [units] each unit's sharded gradient on the device
  if (!input.offload) {
    for (size_t u = 0; u < shard.size(); ++u)
      shard[u] = input.bytes(static_cast<int>(u), shards.padded[u] / m, shard_grads);
  }
  const uint64_t all = std::accumulate(shard.begin(), shard.end(), uint64_t{0});
  // Unit u's peak beside `held` (other units' gradients): its views beside their concatenation, or its reduction.
  const auto unit_peak = [&](size_t u, uint64_t views, uint64_t held) {
    const int unit = static_cast<int>(u);
    const uint64_t flat = input.bytes(unit, input.unit_counts[u], grads);
    uint64_t reduction = flat + (accumulating ? 0 : shard[u]);
    if (m > 1 && (accumulating || shard_grads != grads || input.offload)) {
      reduction += input.bytes(unit, shards.padded[u] / m, grads);
    }
    return held + std::max(views + flat, reduction);
  };
  const uint64_t root = input.bytes(0, shards.padded[0], grads);
  const uint64_t late = input.root_embedding_elements() * dtype_size(grads);
  const uint64_t head = root > late ? root - late : 0;
  uint64_t reduced = 0, peak = 0;  // sharded gradients made so far in the first micro-batch
  for (size_t u = shard.size() - 1; u >= 1; --u) {
    const uint64_t block = input.bytes(static_cast<int>(u), input.unit_counts[u], grads);
    peak = std::max(peak, unit_peak(u, block, head + (accumulating ? all : reduced)));
    reduced += shard[u];
  }
  return std::max(peak, unit_peak(0, root, accumulating ? all : reduced));
}

}  // namespace

Updated predict_fsdp(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction) {
  const Sharding sharding = options.fsdp.sharding;
  // Over TP (--tp T): the input's units are the rank's slices, sharded over (or NO_SHARD: replicated across) the D
  // ranks of the "data-parallel" group.
  const ShardedLayout layout = sharded_layout(options, input, prediction);
  const bool tensor = layout.mesh.tensor > 1;
  const int world = layout.mesh.data;
  const int group_size = shard_group_size(sharding, input, world);
  const int replicas = world / group_size;
  const UnitShards shards = unit_shards(input, group_size);
  const size_t units = input.unit_counts.size();
  const uint64_t param_bytes = dtype_size(options.recipe.params);
  const uint64_t grad_bytes = dtype_size(options.recipe.grads);
  const DType grads = options.recipe.grads;
  const DType shard_grads = options.recipe.has_master ? DType::kF32 : grads;

  const bool kept_shard = group_size == 1 || !options.recipe.has_master;
  const uint64_t gathered = group_size > 1 ? gathered_at_peak(options, input, shards, !kept_shard) : 0;
  prediction.peak[Category::kParameters] =
      (kept_shard ? shards.shard_bytes(input, options.recipe.params) : 0) + gathered;
  const uint64_t gradient_shards = shards.shard_bytes(input, shard_grads);
  prediction.peak[Category::kGradients] = gradient_peak(input, shards, grads, shard_grads);
  if (input.offload) {  // CPUOffload: the sharded gradients in host memory, sent down every step
    prediction.host_peak[Category::kGradients] = gradient_shards;
    prediction.pcie.device_to_host = gradient_shards;
  }
  prediction.formula = tensor ? fmt::format(
                                    "(2 + 2 + K)Ψ/(t·M), t = {}, M = {}: the TP slices sharded over the "
                                    "data-parallel group",
                                    layout.mesh.tensor, group_size)
                       : sharding == Sharding::kNoShard ? "(2 + 2 + K)Ψ: a full replica (NO_SHARD)"
                       : group_size < world
                           ? fmt::format("(2 + 2 + K)Ψ/{}: sharded within {} ranks", group_size, group_size)
                           : "(2 + 2 + K)Ψ/N: everything partitioned";

  const uint64_t micro_batches = static_cast<uint64_t>(input.accumulation);
  const bool across_nodes = group_size < world;
  const std::string group = tensor ? layout.group : across_nodes ? "intra-node" : "world";
  const std::string replica_group = tensor ? layout.group : "inter-node";
  for (size_t unit = 0; unit < units; ++unit) {
    // The root stays gathered between forward and backward; SHARD_GRAD_OP keeps every unit.
    const uint64_t gathers = sharding != Sharding::kShardGradOp && unit != 0 ? 2 : 1;
    add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, group, shards.padded[unit] * param_bytes, group_size,
                     micro_batches * gathers);
    add_ring_traffic(prediction, coll::CollectiveKind::kReduceScatter, group, shards.padded[unit] * grad_bytes,
                     group_size, micro_batches);
    if (across_nodes) {
      add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, replica_group,
                       shards.padded[unit] / group_size * grad_bytes, replicas, micro_batches);
    }
  }
  add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, group, 4,
                   group_size);  // the gradient norm's partial sums
  // torch.optim.AdamW over one flat shard per unit, P_u/M elements each, as a shrunk run charges them.
  Updated updated = shards.updated();
  uint64_t all_shards = 0, largest_shard = 0;
  for (const auto& [unit, elements] : updated) {
    all_shards += input.elements(unit, elements);
    largest_shard = std::max(largest_shard, input.elements(unit, elements));
  }
  switch (options.adamw_impl) {
    case optim::AdamWImpl::kForeach: prediction.step_temporary_elements = all_shards; break;
    case optim::AdamWImpl::kSingle: prediction.step_temporary_elements = 2 * largest_shard; break;
    case optim::AdamWImpl::kFused: break;
  }
  return updated;
}

}  // namespace emu::strategy
