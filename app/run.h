// Running every requested strategy on the shrunk model (or, for a plan, on the full-scale shapes) and collecting
// what each measured: verdicts, per-rank peaks by category, traffic per step, losses, times and timelines.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "app/options.h"
#include "app/timeline.h"
#include "collectives/types.h"
#include "emu/memory.h"
#include "emu/mpi_env.h"
#include "strategies/analytic.h"
#include "strategies/oom.h"
#include "workloads/model/config.h"

namespace emu::app {

// A plan accounts one representative rank per role: ranks first..last hold the same bytes (ZeRO's padding, for
// one, can make the last rank differ from the others), or, where each rank holds its own set of whole tensors
// (ddp-zero), at most the bytes of `accounted`, the rank among them holding the most.
struct RankRole {
  int first = 0;
  int last = 0;
  int accounted = 0;   // the rank whose bytes were accounted for the role
  bool bound = false;  // the ranks hold different bytes, at most `accounted`'s
  int ranks() const { return last - first + 1; }
};

// Traffic per optimizer step of one collective kind in one kind of group ("world", "intra-node", "inter-node").
struct TrafficKey {
  coll::CollectiveKind kind = coll::CollectiveKind::kAllReduce;
  std::string group;
  auto operator<=>(const TrafficKey&) const = default;
};

// One (group, kind, phase) entry of rank 0's ledgers, per optimizer step: what the step-time model
// (step_time.h) places on the step's timeline.
struct PhaseTraffic {
  coll::CollectiveKind kind = coll::CollectiveKind::kAllReduce;
  std::string group;  // its kind: "world", "intra-node", "inter-node", ...
  int group_size = 1;
  std::string algorithm;  // empty for send and recv
  std::string phase;      // the caller's label, e.g. "backward reduce-scatter, unit 7"
  double calls = 0;
  uint64_t payload = 0;  // Σ over the calls of their payload S (the buffer, the whole gathered output, ...), as run
};

struct StrategyOutcome {
  std::string name;
  strategy::StrategyOptions options;
  strategy::OomVerdict verdict;  // same on every rank
  bool fits() const { return !verdict.any(); }
  int steps_run = 0;

  // Rank 0 holds these for every rank; a plan for each of its roles ([ranks] below reads [roles] then, and
  // verdict.ranks too).
  std::vector<RankRole> roles;                // a plan's roles; empty for a run
  std::vector<uint64_t> peak;                 // [ranks] each rank's peak in use
  std::vector<CategoryBytes> category_peaks;  // [ranks] each category's own peak on each rank
  std::vector<CategoryBytes> at_peak;         // [ranks] in use by category when the rank peaked
  int peak_rank = 0;                          // the rank with the highest peak
  // [ranks] the peak of what the device held (the caching allocator's segments + the reserve; = peak when
  // exact), and what was allocated then: reserved_peak - allocated_at_reserved_peak is the fragmentation.
  std::vector<uint64_t> reserved_peak;
  std::vector<uint64_t> allocated_at_reserved_peak;
  int reserved_peak_rank = 0;              // the rank with the highest reserved peak
  strategy::Prediction prediction;         // rank 0's
  std::vector<uint64_t> predicted_states;  // [ranks] each rank's predicted model states (stages differ)
  // [ranks] each rank's predicted peaks by category (pipeline stages, ZeRO-1/2's gradient partitions differ)
  std::vector<CategoryBytes> predicted_peaks;
  uint64_t predicted_activations = 0;  // the model's closed form: saved activations of every block + logits

  // Traffic of rank 0 per optimizer step, by kind and group.
  std::map<TrafficKey, coll::Traffic> traffic_per_step;
  std::map<TrafficKey, uint64_t> calls_per_step;
  strategy::HostTraffic host_per_step;
  std::vector<PhaseTraffic> phase_traffic;  // rank 0's, per optimizer step

  std::vector<double> step_seconds;  // the slowest rank's, per step
  std::vector<float> losses;         // mean over the global batch, per step
  std::vector<double> grad_norms;    // global norm of the mean gradient before clipping, per step

  // On rank 0, when a trace or picture is asked for:
  std::vector<MemorySeries> memory;  // [ranks]
  std::vector<double> oom_seconds;   // [ranks] when each rank first passed the cap; negative if it never did
  // On rank 0, when a trace is asked for:
  std::vector<std::vector<Span>> spans;  // [ranks] in the order they ended
  std::vector<uint64_t> spans_dropped;   // [ranks] spans past the limit per rank, not kept
};

struct RunReport {
  RunOptions options;
  int world = 1;  // ranks that ran (a plan: ranks planned for)
  int hosts = 1;  // a plan: the hosts planned for, world / ranks_per_node
  int ranks_per_node = 1;
  bool plan = false;         // shapes only, at full scale
  model::ModelConfig model;  // what ran: shrunk, or full scale for a plan
  int shrink = 1;            // k of `model` (1 for a plan)
  uint64_t cap = kNoCap;     // per rank, as charged
  uint64_t reserve = 0;      // per rank, as charged
  std::vector<StrategyOutcome> outcomes;
  // False while strategies are still to run (the JSON rewritten after each one, for an interrupted job): those
  // not yet finished are `not_run`.
  bool complete = true;
  std::vector<std::string> not_run;
  double seconds = 0;
  // Bytes of the model's run × scale give full-scale figures: k² for a shrunk run, 1 for a plan.
  // "rank 3" for a run; for a plan's role "any of the 64 ranks", "ranks 0-62" or "rank 63".
  std::string rank_words(const StrategyOutcome& outcome, size_t index) const;
  uint64_t scale() const { return plan ? 1 : static_cast<uint64_t>(shrink) * static_cast<uint64_t>(shrink); }
};

// "intra-node 3" -> "intra-node": the kind of group a communicator's name says, as the analytic model names it.
std::string group_kind(const std::string& communicator_name);

// Called on every rank after each strategy, with the report so far (`complete` false, `not_run` and `seconds` set
// while strategies remain).
using AfterStrategy = std::function<void(const RunReport& so_far)>;

// Collective over the world: runs every strategy in options.strategies, in order, and returns the outcomes
// (complete on rank 0). Prints a progress line per step on rank 0's stderr. Not for a plan (plan_strategies).
RunReport run_strategies(const MpiSession& mpi, const RunOptions& options, const AfterStrategy& after_each = {});

// The report after `done` of the options' strategies: `not_run` names the rest, `complete` says whether any remain.
void mark_progress(RunReport& report, size_t done, double seconds);

}  // namespace emu::app
