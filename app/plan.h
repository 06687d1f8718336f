// Shapes-only planning: the same strategies and the same model code at full scale, charging every allocation
// without holding data or doing the math, for any number of ranks (`--plan 1024`). One process plays rank 0 of
// N: the world and the node groups are virtual communicators (collectives/virtual), which charge the ledger with
// each algorithm's declared volume. A plan accounts one representative rank per role: rank 0, rank 1 for the
// ranks in between and the last rank (shards are equal slices, so only the ends can differ, e.g. where padding
// falls); ranks that hold the same bytes are one role, reported with the ranks it covers.
//
// Find the limit (`--find-limit micro-batch|seq-len`): per strategy, the largest micro-batch or sequence length
// whose plan fits the cap, by doubling then bisection (a plan's peak grows with both).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "app/run.h"

namespace emu::app {

// The optimizer steps a plan accounts: two, or one when --steps asks for one or none. PyTorch's caching allocator
// settles in the second step: the first makes AdamW's moments and the strategies' lazily made buffers among blocks
// that backward cached, and the second step's requests meet the cache as later steps do (llama3-8b zero2 on 8
// GPUs reserves 46.41 GiB in its first step, 50.33 GiB in each later one; README, Shapes-only planning). Peaks are
// over the steps; traffic is per step.
int plan_steps(const RunOptions& options);
// The steps a report names: a plan's plan_steps, a run's --steps.
int reported_steps(const RunOptions& options);

// One strategy of `options` accounted for `ranks` ranks on a shapes-only device over virtual groups: plan_steps
// steps of `config`. At full scale (config.shrink 1) this is the plan; a shrunk config (shrink.h) goes through the same
// allocations as a shrunk run does, its buckets, thresholds, slices, cap and reserve ÷ k², so the two can be
// compared without running the shrunk math.
// `rank`: the rank accounted; `record`: keep its memory timeline and spans (a plan's --svg and --trace);
// `stop_at_oom`: throw OutOfMemoryError at the first allocation past the cap instead of finishing the step over it.
StrategyOutcome account_shapes(const RunOptions& options, const strategy::StrategyOptions& strategy_options,
                               const model::ModelConfig& config, int ranks, int ranks_per_node, int rank = 0,
                               bool record = false, bool stop_at_oom = false);

// Whether `strategy_options` fits `ranks` ranks with `config` (options.full: at full scale, as plan_strategies would
// find it; a shrunk config: as a shrunk run would): the highest reserved peak of its roles, or nothing when a role
// runs out of memory. Stops at the first allocation past the cap (OomMode::kStrict), so a configuration that does
// not fit costs only the step up to there (the advisor).
// `first`, when given, receives rank 0's outcome (its traffic by phase: what a step-time prediction reads).
std::optional<uint64_t> planned_fit(const RunOptions& options, const strategy::StrategyOptions& strategy_options,
                                    const model::ModelConfig& config, int ranks, int ranks_per_node,
                                    StrategyOutcome* first = nullptr);

// Rank 0 only: plans every strategy of `options` for options.plan_ranks (or `world`) ranks.
// Prints on stderr each strategy's time when the plan is a long one.
RunReport plan_strategies(const RunOptions& options, int world, int ranks_per_node,
                          const AfterStrategy& after_each = {});

struct Limit {
  std::string strategy;
  int64_t largest = 0;           // 0: not even 1 fits
  uint64_t peak_at_largest = 0;  // bytes per rank at full scale
  uint64_t peak_above = 0;       // the peak one step further, which does not fit (0 when the search hit its top)
  int64_t searched_up_to = 0;
};

// Rank 0 only. `what` is "micro-batch" or "seq-len".
std::vector<Limit> find_limits(const RunOptions& options, int world, int ranks_per_node, const std::string& what);
std::string format_limits(const RunOptions& options, int world, const std::string& what,
                          const std::vector<Limit>& limits);
std::string format_limits_json(const RunOptions& options, int world, const std::string& what,
                               const std::vector<Limit>& limits);

}  // namespace emu::app
