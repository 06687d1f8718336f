// Pipeline parallelism's stage split (strategies/pipeline.cpp, `pp`): which blocks each of P stages runs.
//
// The L blocks are cut into P contiguous, non-empty stages balanced by parameter count, as DeepSpeed's
// PipelineModule(partition_method="parameters") balances them (runtime/pipe/module.py, ds_utils.partition_balanced):
// the split that makes the heaviest stage lightest, where the first stage also carries the embeddings and the
// last the final norm and the LM head (and, tied, its own copy of the embedding, as Megatron-LM's last stage keeps
// one: core/models/common/language_module.py, setup_embeddings_and_output_layer).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace emu::strategy {

enum class Schedule : uint8_t;  // strategy.h

struct StageBlocks {
  int first = 1;  // blocks first..last, 1-based
  int last = 1;
};

// P stages over blocks of the given weights (parameters of block 1..L, in order), the first stage also weighing
// `first_extra` and the last `last_extra`. Among equally heavy splits, the one giving earlier stages more blocks.
// Needs 1 ≤ P ≤ L.
std::vector<StageBlocks> balance_stages(std::span<const uint64_t> block_weights, uint64_t first_extra,
                                        uint64_t last_extra, int stages);

// The bubble of a synchronous pipeline schedule (GPipe and 1F1B alike): (P − 1)/(M + P − 1) of a step idle.
double bubble_fraction(int stages, int micro_batches);

// One entry of a stage's schedule: the forward or the backward of micro-batch `micro_batch` (0-based).
struct PipelineOp {
  bool forward = true;
  int micro_batch = 0;
  bool operator==(const PipelineOp&) const = default;
};

// The order in which stage `stage` (0-based) of `stages` runs the forwards and backwards of `micro_batches`
// micro-batches: GPipe every forward then every backward; 1F1B min(P − s − 1, M) warm-up forwards, then one forward
// and one backward in turn, then the remaining backwards (Megatron-LM's
// forward_backward_pipelining_without_interleaving). The `pp` strategy runs exactly this order.
std::vector<PipelineOp> stage_order(Schedule schedule, int stages, int stage, int micro_batches);

// The largest number of micro-batches whose activations a stage holds at once under `order` (a forward adds one, a
// backward frees one).
int most_in_flight(std::span<const PipelineOp> order);

struct TimedOp {
  PipelineOp op;
  double start = 0;
  double end = 0;
};
// Every stage's schedule placed in time, for the trace's pipeline view: each op starts when the stage's previous op
// has ended and its input is there (a forward after the previous stage's forward of its micro-batch, a backward
// after the next stage's backward of it), and lasts `forward_seconds` or `backward_seconds` (every stage alike, the
// step-time model's slot of the slowest stage). The idle gaps are the bubble: with equal stages the last op ends at
// (M + P − 1) × (forward + backward) under either schedule. [stage][op]
std::vector<std::vector<TimedOp>> pipeline_timeline(Schedule schedule, int stages, int micro_batches,
                                                    double forward_seconds, double backward_seconds);

}  // namespace emu::strategy
