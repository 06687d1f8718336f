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

// Interleaved 1F1B (Megatron-LM's virtual pipeline stages, --num-virtual-stages-per-pipeline-rank V): each stage
// holds V model chunks, chunk v of stage p the blocks of layer group v·P + p of P·V equal groups (Megatron's
// get_transformer_layer_offset), so a micro-batch goes round the P stages V times, from the last stage back to the
// first between chunks. Needs P ≥ 2 and L divisible by P·V. Blocks 1..L, 1-based: [P][V].
std::vector<std::vector<StageBlocks>> interleaved_chunks(int layers, int stages, int chunks);

// The bubble of a synchronous pipeline schedule (GPipe and 1F1B alike): (P − 1)/(M + P − 1) of a step idle; with V
// chunks per stage (interleaved 1F1B) each slot is 1/V as long, (P − 1)/(V·M + P − 1): (P − 1)/(V·M) of the ideal
// step (Narayanan et al. 2021, §2.2.2).
double bubble_fraction(int stages, int micro_batches, int chunks = 1);

// One entry of a stage's schedule: the forward or the backward of micro-batch `micro_batch` (0-based) through the
// stage's model chunk `chunk` (0 unless interleaved).
struct PipelineOp {
  bool forward = true;
  int micro_batch = 0;
  int chunk = 0;
  bool operator==(const PipelineOp&) const = default;
};

// The order in which stage `stage` (0-based) of `stages` runs the forwards and backwards of `micro_batches`
// micro-batches: GPipe every forward then every backward; 1F1B min(P − s − 1, M) warm-up forwards, then one forward
// and one backward in turn, then the remaining backwards (Megatron-LM's
// forward_backward_pipelining_without_interleaving). With `chunks` V > 1 (1F1B only, M a multiple of P) Megatron's
// forward_backward_pipelining_with_interleaving (core/pipeline_parallel/schedules.py): V·M virtual micro-batches
// taken from its schedule table (get_schedule_table: groups of P micro-batches, each group through chunk 0, then
// chunk 1, …; backwards through the chunks in reverse), min(2(P − s − 1) + (V − 1)·P, V·M) warm-up forwards
// (get_pp_rank_microbatches), then one forward and one backward in turn, then the remaining backwards. The `pp`
// strategy runs exactly this order.
std::vector<PipelineOp> stage_order(Schedule schedule, int stages, int stage, int micro_batches, int chunks = 1);

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
// With V chunks the op durations are one chunk's, and a micro-batch's forward of chunk v > 0 on the first stage waits
// for chunk v − 1's on the last (its backward of chunk v < V − 1 on the last stage for chunk v + 1's on the first).
std::vector<std::vector<TimedOp>> pipeline_timeline(Schedule schedule, int stages, int micro_batches,
                                                    double forward_seconds, double backward_seconds, int chunks = 1);

// What a stage does, in order, to run its schedule over emu's blocking point-to-point messages: its ops, and each
// activation or gradient it sends or receives. Activations go to the next stage (the last stage's chunk v to the
// first stage's chunk v + 1), gradients the other way. Every stage's messages follow one global order (by when the
// receiving op starts in pipeline_timeline, forward 1 and backward 2), so blocking sends and receives cannot
// deadlock, even round the ring interleaving makes; a stage receives just before the op that reads the message, and
// a sender keeps its output until then. `op` of a send is the op that made the message, of a receive the op that
// reads it; `peer` the other stage.
struct StageEvent {
  enum class Kind : uint8_t { kCompute, kSend, kReceive };
  Kind kind = Kind::kCompute;
  PipelineOp op;
  int peer = -1;
  bool operator==(const StageEvent&) const = default;
};
std::vector<StageEvent> stage_program(Schedule schedule, int stages, int stage, int micro_batches, int chunks = 1);

}  // namespace emu::strategy
