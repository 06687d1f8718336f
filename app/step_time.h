// The step-time model: how long one optimizer step of a finished run or plan would take on named GPUs and links,
// and where the time goes (compute, communication the strategy cannot hide, the pipeline's bubble, offload).
//
// What it is computed from, all of which emu knows exactly for the strategy it ran or planned:
//   - every op of the model at its shapes (workloads/model/op_costs.h), each timed by a roofline:
//     max(FLOPs / (achievable fraction × peak), bytes / (achievable fraction × HBM bandwidth));
//   - every collective of the step from the ledger (StrategyOutcome::phase_traffic): kind, group and its size,
//     algorithm, calls and bytes per phase; each call timed by its algorithm's α-β cost (collectives/cost.h) over
//     NVLink inside a node or the two-link fabric across nodes (fabric_for: the hierarchical all-reduce's
//     inter-node part over the NICs, its intra-node part over NVLink);
//   - the order of the step (forward units, backward units in reverse, then the optimizer) and the strategy's
//     overlap rules, read from the phase each collective was issued in: "forward …, unit u" is an all-gather
//     prefetched while the unit before computes (ZeRO-3, FSDP); "backward …" runs on the communication stream as
//     soon as the unit's (or the bucket's) gradients are ready, overlapped with the rest of backward (DDP's
//     buckets, ZeRO-2's reduce buckets, FSDP's reduce-scatters); every other phase (ZeRO-1's reduce-scatter after
//     backward, the parameter all-gather after the step, the gradient norm) is exposed;
//   - offload: the PCIe bytes the strategy counted, over the host link, and the CPU's AdamW on the rank's shard,
//     both exposed (DeepSpeed's ZeRO-Offload overlaps part of them; emu assumes none: an upper bound);
//   - pp: (M + P − 1) slots of the slowest stage's forward + backward, the P − 1 extra ones the bubble.
//
// The fractions of peak a real kernel reaches are assumptions, stated in one place (achievable_for) and shown in
// the report's header; `--achievable` overrides them (e.g. after calibrating on a GPU).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "app/run.h"
#include "collectives/cost.h"
#include "emu/hardware.h"
#include "strategies/pipeline.h"
#include "workloads/model/op_costs.h"

namespace emu::coll {
class Communicator;
}

namespace emu::app {

// Fractions of a datasheet figure real kernels and collectives reach.
struct Achievable {
  double matmul = 0;                 // of the dense peak, for the linears (cuBLAS GEMMs)
  double attention = 0;              // of the dense peak, for the attention kernel (flash / SDPA)
  double memory = 0;                 // of the HBM bandwidth, for element-wise ops, norms and the optimizer
  double intra_link = 0;             // of the NVLink bandwidth per direction: nccl-tests' bus bandwidth / the link's
  double inter_link = 0;             // of the network bandwidth per GPU
  double host_link = 0;              // of the PCIe bandwidth (offload)
  double cpu_adam_params_per_s = 0;  // the host's AdamW (DeepSpeed's CPU Adam) over the offloaded shard
  std::string basis;                 // where the defaults come from, one line for the header
};

// The defaults for a GPU generation (A100; H100 and H200; anything else), from published measurements where
// there are some (step_time.cpp cites them) and stated as assumptions where not.
Achievable achievable_for(const Hardware& hardware);
// Applies "matmul=0.7,attention=0.5,..." (the --achievable flag) to `base`; InputError naming the bad key or value
// and the accepted ones (each fraction in (0, 1], cpu_adam > 0).
Achievable parse_achievable(std::string_view spec, Achievable base);

// Everything the prediction needs besides the run: the hardware, its fractions and the node size.
struct StepTimeSetting {
  Hardware hardware;
  Achievable achievable;
  int gpus_per_node = 8;
};

// One op's seconds by the roofline; `compute` picks the bf16 (tensor core) or fp32 peak.
double op_seconds(const model::OpCost& op, const StepTimeSetting& setting, DType compute);

// How a group's ranks sit on the nodes, which decides the link its collectives run over.
enum class Reach : uint8_t {
  kInsideNode,     // every rank in one node: NVLink
  kWholeNodes,     // every GPU of several nodes (the world): NCCL's rings cross each node boundary once per ring,
                   // spread over all the node's NICs, so the network offers the node's NICs together
  kOneGpuPerNode,  // one GPU per node (HSDP's replicas): each on its own NIC
};
// Which Reach a group of `group_size` ranks of kind `group` ("world", "intra-node", "inter-node", ...) is in a world
// of `world` ranks with `gpus_per_node` per node.
Reach reach_of(std::string_view group, int group_size, int world, int gpus_per_node);

// The α-β link of a reach. Inside a node: NVLink's rate and step latency. Whole nodes: the slower of NVLink and
// the node's NICs together (gpus_per_node × the per-GPU figure), with the network's latency on the steps that
// cross a node (nodes of the 2(N−1) steps of an N-rank ring in each direction) and NVLink's on the rest. One GPU
// per node: one NIC. γ = 0: NCCL reduces inside its copy kernels at HBM speed, far above either link.
coll::LinkModel link_for(const StepTimeSetting& setting, Reach span, int ranks = 1);

// The two-link fabric (collectives/cost.h) a group of `ranks` in `span` runs over. Inside a node or one GPU per node:
// the one link above. Over whole nodes, L = gpus_per_node ranks per node: NVLink within the node, one NIC per rank
// for what an algorithm states goes between nodes (the hierarchical all-reduce's L rings between nodes, one per
// local rank, each on its rank's NIC), and the whole-node link above for a flat algorithm (NCCL's channels spread
// it over every NIC of the node). Nodes of unequal size (L does not divide the group): the whole-node link for all.
coll::Fabric fabric_for(const StepTimeSetting& setting, Reach span, int ranks = 1);

// Seconds of one call of `kind` with a payload of `payload` bytes over `ranks` ranks: the algorithm's α-β cost
// (the ring's where `algorithm` states none, as MPI's own) over the fabric, taken for its L ranks per node, plus the
// call's fixed latency.
double collective_seconds(coll::CollectiveKind kind, std::string_view algorithm, double payload, int ranks,
                          const coll::Fabric& fabric, double call_latency);
// The same over one link.
double collective_seconds(coll::CollectiveKind kind, std::string_view algorithm, double payload, int ranks,
                          const coll::LinkModel& link, double call_latency);

// One piece of a compute stream with the communication tied to it: `before` must finish before the compute
// starts (an all-gather of the unit's parameters, issued when the previous piece starts computing: one prefetch
// in flight), `after` starts once the compute ends (the reduction of the gradients it produced). One
// communication stream runs them in issue order.
struct Chunk {
  double compute = 0;
  double before = 0;
  double after = 0;
  std::string name;  // "forward, block 3": the predicted trace's label
};
// One span of the predicted step, for the trace's second timeline: on the compute or the communication stream.
struct PredictedSpan {
  std::string name;
  bool communication = false;
  double start = 0;  // seconds since the step began
  double end = 0;
};
struct Timeline {
  double seconds = 0;  // until the last compute and the last communication have ended
  double compute = 0;  // the sum of the chunks' compute
  double exposed() const { return seconds - compute; }
};
// `spans`, when given, receives each piece's compute and communication as they were placed.
Timeline overlap(std::span<const Chunk> chunks, std::vector<PredictedSpan>* spans = nullptr);

struct StepTime {
  double seconds = 0;                // one optimizer step
  double compute = 0;                // the GPU's own work: forward, backward (and recomputation), optimizer
  double exposed_communication = 0;  // collectives the compute did not hide
  double communication = 0;          // every collective's time, hidden or not
  double bubble = 0;                 // pp: stages idle waiting for the pipeline to fill and drain
  double offload = 0;                // PCIe transfers and the CPU's optimizer step
  double tokens_per_second_per_gpu = 0;
  double mfu = 0;          // model FLOPs (model::step_flops: 6 per parameter per token + attention) / (s × peak)
  double model_flops = 0;  // per GPU per step
  std::vector<PredictedSpan> spans;  // the step as predicted (pp: its slots), for the trace
  // pp: every stage's forwards and backwards as its schedule places them, each lasting the slowest stage's share of
  // a slot (its p2p included), from the step's start; the trace's pipeline view. [stage][op]
  std::vector<std::vector<strategy::TimedOp>> pipeline;
  int pipeline_chunks = 1;  // pp: V, the model chunks each stage's ops run through (interleaved 1F1B)
};

// The predicted step of one strategy of a finished run or plan (rank 0's outcome, with phase_traffic). Figures are
// at full scale: a shrunk run's traffic × k², the op costs at the full-scale shapes.
//
// For the advisor and anyone ranking configurations: plan each candidate (account_shapes or plan_strategies fill
// phase_traffic), then
//   const StepTimeSetting setting = step_time_setting(options);   // or built by hand
//   const StepTime t = predict_step_time(options, ranks, outcome, setting);   // a plan: scale 1
// and rank by t.seconds (or t.tokens_per_second_per_gpu: the global batch may differ between candidates).
StepTime predict_step_time(const RunReport& report, const StrategyOutcome& outcome, const StepTimeSetting& setting);
// The same from the options the outcome was run or planned with, over `world` ranks, its bytes × `scale` at full
// scale (k² for a shrunk run, 1 for a plan).
StepTime predict_step_time(const RunOptions& options, int world, const StrategyOutcome& outcome,
                           const StepTimeSetting& setting, uint64_t scale = 1);

// The setting --hardware, --gpus-per-node and --achievable ask for; empty hardware name: none.
StepTimeSetting step_time_setting(const RunOptions& options);

// Appends one group's ledger to outcome.phase_traffic, per optimizer step (`steps` steps ran); skips what is not
// training traffic (the report's own gathers, the out-of-memory agreement).
void record_phase_traffic(StrategyOutcome& outcome, const coll::Communicator& group, double steps);

// The table beside the memory verdicts: per strategy its predicted step, split, tokens/s per GPU and MFU; the
// header line names the hardware and the fractions assumed. Empty when no --hardware was given.
std::string format_step_times(const RunReport& report);

}  // namespace emu::app
