// The analytic model: what a strategy should need per rank and move per step, from the ZeRO paper's formulas
// (Rajbhandari et al. 2020, §5: 2Ψ + 2Ψ + KΨ with K = 12 for mixed-precision Adam, divided by N as each stage
// partitions more) plus the buffers each framework adds on top. It is computed from the model's unit sizes and
// the strategy's options alone, never from a run, and printed beside what was measured.
//
// Memory, per rank and category, at the peak of a step (Ψ parameters, N ranks; p, g bytes of a parameter and a
// gradient; P = Ψ padded to a multiple of N, S = P/N; n_u, P_u = N·S_u one unit's elements, padded):
//   ddp    parameters Ψp  gradients Ψg  buckets Ψg (none with gradient_as_bucket_view)  master + moments ΨK
//   zero1  parameters Pp  gradients Pg                                                    master + moments SK
//   zero2  parameters Pp  gradients Sg + (n_root + max n_block)g while they are made
//          buckets B·g (×2 with overlap_comm), B = reduce bucket ≥ the largest unit       master + moments SK
//   zero3, fsdp  parameters Σ S_u p + gathered units; gradients Σ S_u g' + (P_root + P_block)g while made;
//          master + moments Σ S_u K, with the gathered units: the root throughout, one block (two with
//          backward prefetch, every block for SHARD_GRAD_OP, the prefetch window for ZeRO-3), and g' = 4 for FSDP's
//          fp32 gradient shards in the mixed recipe
// Traffic, bytes each rank sends per step, at ring volumes: all-reduce 2(N−1)/N·S, reduce-scatter and
// all-gather (N−1)/N·S of a payload S (collectives/types.h), per call, summed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/types.h"
#include "emu/memory.h"
#include "strategies/strategy.h"

namespace emu::strategy {

struct AnalyticInput {
  std::vector<uint64_t> unit_counts;  // n_u: root first, then blocks
  int world = 1;                      // N
  int ranks_per_node = 1;             // HYBRID_SHARD's shard group
  int accumulation = 1;               // micro-batches per step
};

// The input for `model` as it is laid out in units.
AnalyticInput analytic_input(const model::Model& model, int world, int ranks_per_node, int accumulation);

struct PredictedTraffic {
  coll::Kind kind = coll::Kind::kAllReduce;
  std::string group;  // "world", "intra-node", "inter-node"
  uint64_t calls = 0;
  uint64_t sent = 0;  // bytes per rank per step
};

struct Prediction {
  CategoryBytes peak;  // model states and strategy buffers at their peak (activations are the model's)
  std::vector<PredictedTraffic> traffic;
  std::string formula;  // the ZeRO-paper line this strategy follows, e.g. "(2 + 2 + 12/N)Ψ"

  uint64_t model_state_bytes() const;  // parameters + gradients + master weights + optimizer state
  uint64_t sent(coll::Kind kind) const;
};

Prediction predict(const StrategyOptions& options, const AnalyticInput& input);

}  // namespace emu::strategy
