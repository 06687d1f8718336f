#include "app/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "app/json_report.h"
#include "app/one_strategy.h"
#include "app/step_time.h"
#include "collectives/virtual/virtual_link.h"
#include "emu/check.h"
#include "emu/device.h"
#include "emu/units.h"
#include "strategies/strategy.h"
#include "workloads/model/layout.h"
#include "workloads/model/model.h"

namespace emu::app {
namespace {

constexpr int64_t kMaxMicroBatch = 4096;  // as --micro-batch accepts
constexpr int64_t kMaxSeqLen = 1 << 20;   // as --seq-len accepts

// What a plan does around its steps (plan_steps): micro-batches of the right shape, a stop after a step that ran
// out of memory (as a run stops), and at the end this process's pool and ledgers, which speak for every rank.
class PlanDriver final : public StepDriver {
 public:
  PlanDriver(const model::ModelConfig& config, int accumulation, const MemoryPool& pool, int rank,
             const SpanRecorder* spans)
      : config_(config), accumulation_(accumulation), pool_(pool), rank_(rank), spans_(spans) {}

  // Token ids are read by nothing on a shapes-only device; they only give the micro-batches their shape.
  std::vector<data::Batch> micro_batches(int step) override { return replica_micro_batches(step, accumulation_, 0, 1); }

  std::vector<data::Batch> replica_micro_batches(int step, int count, int /*replica*/, int /*replicas*/) override {
    data::Batch batch;
    batch.batch = config_.batch;
    batch.seq_len = config_.seq;
    batch.tokens.assign(static_cast<size_t>(config_.batch * config_.seq), 0);
    batch.targets = batch.tokens;
    return std::vector<data::Batch>(static_cast<size_t>(count), batch);
  }

  bool after_step(int step, const strategy::StepResult& result, StrategyOutcome& outcome) override {
    outcome.steps_run = step + 1;
    return !pool_.first_oom();
  }

  void finish(StrategyOutcome& outcome, const model::Model& model, strategy::Strategy& strategy) override {
    strategy::RankMemory mine;
    mine.rank = rank_;
    mine.cap = pool_.cap();
    mine.peak = pool_.reserved_peak();
    if (const auto& oom = pool_.first_oom()) {
      mine.out_of_memory = true;
      mine.requested = oom->requested;
      mine.in_use = oom->in_use;
      mine.phase = oom->phase;
      mine.what = oom->what;
    }
    outcome.verdict.ranks.push_back(mine);
    outcome.peak = {pool_.peak()};
    outcome.reserved_peak = {pool_.reserved_peak()};
    outcome.allocated_at_reserved_peak = {pool_.allocated_at_reserved_peak()};
    outcome.category_peaks = {pool_.category_peaks()};
    outcome.at_peak = {pool_.breakdown_at_peak()};
    // Every step moves the same bytes: the ledgers' totals over the steps accounted.
    const double steps = std::max(1, outcome.steps_run);
    for (coll::Communicator* group : strategy.groups()) {
      add_traffic_per_step(outcome, *group, steps);
      record_phase_traffic(outcome, *group, steps);
    }
    outcome.host_per_step = {per_step(strategy.host_traffic().device_to_host, steps),
                             per_step(strategy.host_traffic().host_to_device, steps)};
    if (spans_ != nullptr) {
      outcome.memory = {thin_timeline(pool_.timeline())};
      outcome.oom_seconds = {pool_.first_oom() ? pool_.first_oom()->seconds : -1.0};
      outcome.spans = {spans_->spans()};
      outcome.spans_dropped = {spans_->dropped()};
    }
  }

 private:
  const model::ModelConfig& config_;
  const int accumulation_;
  const MemoryPool& pool_;
  const int rank_;
  const SpanRecorder* spans_;  // null unless recording
};

}  // namespace

int plan_steps(const RunOptions& options) { return std::clamp(options.steps, 1, 2); }

int reported_steps(const RunOptions& options) { return options.plan ? plan_steps(options) : options.steps; }

StrategyOutcome account_shapes(const RunOptions& options, const strategy::StrategyOptions& strategy_options,
                               const model::ModelConfig& config, int ranks, int ranks_per_node, int rank, bool record,
                               bool stop_at_oom) {
  // At full scale the cap is as stated ("40GB-scaled" and "40GB" both mean 40 GB per GPU here); a shrunk config
  // gets the run's cap and reserve, ÷ k².
  const int shrink = static_cast<int>(config.shrink);
  const auto k2 = static_cast<uint64_t>(shrink) * static_cast<uint64_t>(shrink);
  MemoryPool::Options memory;
  memory.cap = options.cap.unlimited ? kNoCap : options.cap.per_rank_bytes(shrink);
  memory.reserve = options.reserve_full_scale / k2;
  memory.scale = k2;  // the caching allocator sees full-scale sizes, as in the run (run.cpp)
  memory.mode = stop_at_oom ? OomMode::kStrict : OomMode::kRecord;
  memory.timeline = record;
  memory.allocator = options.allocator;
  memory.alloc_conf = options.alloc_conf;
  auto device = make_shapes_device(memory);
  device->memory().set_strategy(strategy_options.name());
  auto host = make_shapes_device({});
  std::optional<SpanRecorder> spans;
  if (record) spans.emplace(steady_seconds());
  const int node = rank / ranks_per_node, local = rank % ranks_per_node;
  // The world runs the algorithms --collectives names, over nodes of ranks_per_node as a run's world does
  // (run.cpp, make_groups), so that the predicted step times them as the run would.
  auto world = coll::make_virtual_communicator(*device, rank, ranks, "world", shrink,
                                               ranks % ranks_per_node == 0 ? ranks_per_node : 0);
  world->set_algorithms(options.collectives);
  auto intra =
      coll::make_virtual_communicator(*device, local, ranks_per_node, fmt::format("intra-node {}", node), shrink);
  auto inter = coll::make_virtual_communicator(*device, node, ranks / ranks_per_node,
                                               fmt::format("inter-node {}", local), shrink);
  const int post_forward_ranks = strategy_options.fsdp2.post_forward_ranks;
  auto post_forward = post_forward_ranks > 0 ? coll::make_virtual_communicator(
                                                   *device, rank % post_forward_ranks, post_forward_ranks,
                                                   fmt::format("post-forward {}", rank / post_forward_ranks), shrink)
                                             : nullptr;
  const Stage stage{.device = *device,
                    .offload = options.offload ? host.get() : nullptr,
                    .parameter_host = strategy_options.zero.offload_param ? host.get() : nullptr,
                    .world = *world,
                    .intra = intra.get(),
                    .inter = inter.get(),
                    .post_forward = post_forward.get(),
                    .control = nullptr,
                    .model = config,
                    .model_options = options.model_options,
                    .initial_weights = nullptr,
                    .shrink = shrink,
                    .ranks = ranks,
                    .ranks_per_node = ranks_per_node,
                    .accumulation = options.accumulation,
                    .pipeline_micro_batches = pipeline_micro_batches(options, ranks),
                    .steps = plan_steps(options),
                    .spans = spans ? &*spans : nullptr};
  PlanDriver driver(config, options.accumulation, device->memory(), rank, stage.spans);
  return run_one_strategy(stage, strategy_options, driver);
}

namespace {

StrategyOutcome plan_one(const RunOptions& options, const strategy::StrategyOptions& strategy_options,
                         const model::ModelConfig& config, int ranks, int ranks_per_node) {
  return account_shapes(options, strategy_options, config, ranks, ranks_per_node);
}

bool same_bytes(const StrategyOutcome& a, const StrategyOutcome& b) {
  return a.peak == b.peak && a.reserved_peak == b.reserved_peak &&
         a.category_peaks.front().bytes == b.category_peaks.front().bytes && a.verdict.any() == b.verdict.any();
}

// Appends `from`'s one accounted rank to `into` as a role covering ranks first..last.
void add_role(StrategyOutcome& into, StrategyOutcome&& from, RankRole role) {
  into.roles.push_back(role);
  into.verdict.ranks.push_back(from.verdict.ranks.front());
  into.verdict.ranks.back().rank = role.accounted;
  into.peak.push_back(from.peak.front());
  into.reserved_peak.push_back(from.reserved_peak.front());
  into.allocated_at_reserved_peak.push_back(from.allocated_at_reserved_peak.front());
  into.category_peaks.push_back(from.category_peaks.front());
  into.predicted_states.push_back(from.prediction.model_state_bytes());
  into.predicted_peaks.push_back(from.prediction.peak);
  into.at_peak.push_back(from.at_peak.front());
  const auto last = static_cast<int>(into.peak.size()) - 1;
  if (into.peak[last] > into.peak[into.peak_rank]) into.peak_rank = last;
  if (into.reserved_peak[last] > into.reserved_peak[into.reserved_peak_rank]) into.reserved_peak_rank = last;
  if (!from.memory.empty()) into.memory.push_back(std::move(from.memory.front()));
  if (!from.oom_seconds.empty()) into.oom_seconds.push_back(from.oom_seconds.front());
  if (!from.spans.empty()) into.spans.push_back(std::move(from.spans.front()));
  if (!from.spans_dropped.empty()) into.spans_dropped.push_back(from.spans_dropped.front());
}

// A long plan says how far it is on stderr: past kProgressAfter seconds, each representative rank accounted is a
// line. A plan's time grows with the layers, not with the ranks: each collective's bytes come from its algorithm's
// closed form over the virtual group (BlockView), never a pass over every rank (0.5 s for llama2-7b under zero3
// at 1 rank and at 1,048,576 ranks on a 2-core machine).
constexpr double kProgressAfter = 1.0;

struct PlanProgress {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
};

void report_progress(const PlanProgress& progress, const std::string& strategy, const RankRole& span, int ranks,
                     size_t index, size_t count) {
  if (progress.seconds() < kProgressAfter) return;
  std::fprintf(stderr, "emu: plan: %s, rank %d accounted for ranks %d-%d of %d (%zu of %zu), %.1f s so far\n",
               strategy.c_str(), span.accounted, span.first, span.last, ranks, index + 1, count, progress.seconds());
  std::fflush(stderr);
}

// The ranks a plan accounts: rank 0, one rank standing for ranks 1..N-2 (rank 1, or the one holding the most where
// ranks hold different tensors: strategy::representative_rank), and rank N-1; every stage of a pipeline.
std::vector<RankRole> role_spans(const strategy::StrategyOptions& strategy_options, const model::ModelConfig& config,
                                 int ranks, bool offload) {
  std::vector<RankRole> spans = {{0, 0, 0}};
  if (strategy::pipelined(strategy_options)) {
    // Every stage holds its own layers and activations: stage p is ranks p·T … p·T + T − 1 (its TP ranks hold the
    // same bytes); with data-parallel pipelines, the first pipeline's stages stand for those of the others.
    const strategy::Mesh mesh = strategy::mesh_of(strategy_options, ranks, 0);
    spans.front().last = mesh.tensor - 1;
    for (int p = 1; p < mesh.pipeline; ++p) {
      spans.push_back({p * mesh.tensor, p * mesh.tensor + mesh.tensor - 1, p * mesh.tensor});
    }
  } else {
    if (ranks > 2) {
      const strategy::Representative middle =
          strategy::representative_rank(strategy_options, config, ranks, 1, ranks - 2, offload);
      spans.push_back({1, ranks - 2, middle.rank, middle.bound});
    }
    if (ranks > 1) spans.push_back({ranks - 1, ranks - 1, ranks - 1});
  }
  return spans;
}

// The plan of one strategy for `ranks` ranks: its role_spans accounted, then merged into roles where neighbours hold
// the same bytes. Traffic and the prediction are rank 0's.
StrategyOutcome plan_roles(const RunOptions& options, const strategy::StrategyOptions& strategy_options,
                           const model::ModelConfig& config, int ranks, int ranks_per_node, bool record,
                           const PlanProgress& progress) {
  const std::vector<RankRole> spans = role_spans(strategy_options, config, ranks, options.offload);
  StrategyOutcome first =
      account_shapes(options, strategy_options, config, ranks, ranks_per_node, spans.front().accounted, record);
  report_progress(progress, first.name, spans.front(), ranks, 0, spans.size());
  StrategyOutcome out;  // name, options, prediction and traffic: rank 0's; the per-rank figures: per role
  out.name = first.name;
  out.options = first.options;
  out.steps_run = first.steps_run;
  out.prediction = first.prediction;
  out.predicted_activations = first.predicted_activations;
  out.traffic_per_step = first.traffic_per_step;
  out.calls_per_step = first.calls_per_step;
  out.host_per_step = first.host_per_step;
  out.phase_traffic = first.phase_traffic;
  StrategyOutcome previous = first;
  add_role(out, std::move(first), spans.front());
  for (size_t i = 1; i < spans.size(); ++i) {
    StrategyOutcome next =
        account_shapes(options, strategy_options, config, ranks, ranks_per_node, spans[i].accounted, record);
    report_progress(progress, next.name, spans[i], ranks, i, spans.size());
    if (same_bytes(previous, next) && !out.roles.back().bound && !spans[i].bound) {
      out.roles.back().last = spans[i].last;
      continue;
    }
    previous = next;
    add_role(out, std::move(next), spans[i]);
  }
  return out;
}

int group_size(const RunOptions& options, int world, int ranks_per_node) {
  const int per_node = options.ranks_per_node > 0 ? options.ranks_per_node : ranks_per_node;
  return world % per_node == 0 ? per_node : 1;
}

uint64_t planned_peak(const RunOptions& options, const strategy::StrategyOptions& strategy_options,
                      const model::ModelConfig& config, int world, int per_node, bool& fits) {
  const StrategyOutcome outcome = plan_one(options, strategy_options, config, world, per_node);
  fits = outcome.fits();
  return outcome.reserved_peak.front();  // what the cap is checked against
}

}  // namespace

RunReport plan_strategies(const RunOptions& options, int world, int ranks_per_node, const AfterStrategy& after_each) {
  const auto start = std::chrono::steady_clock::now();
  RunReport report;
  report.options = options;
  report.world = options.plan_ranks > 0 ? options.plan_ranks : world;
  report.ranks_per_node = group_size(options, report.world, ranks_per_node);
  report.hosts = report.world / report.ranks_per_node;
  report.plan = true;
  report.model = options.full;
  report.shrink = 1;
  report.cap = options.cap.unlimited ? kNoCap : options.cap.bytes;
  report.reserve = options.reserve_full_scale;
  const PlanProgress progress;
  for (const strategy::StrategyOptions& strategy_options : options.strategies) {
    const bool record = !options.svg_path.empty() || !options.trace_path.empty();
    report.outcomes.push_back(
        plan_roles(options, strategy_options, options.full, report.world, report.ranks_per_node, record, progress));
    mark_progress(report, report.outcomes.size(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (after_each) after_each(report);
  }
  return report;
}

std::optional<uint64_t> planned_fit(const RunOptions& options, const strategy::StrategyOptions& strategy_options,
                                    const model::ModelConfig& config, int ranks, int ranks_per_node,
                                    StrategyOutcome* first) {
  const int per_node = group_size(options, ranks, ranks_per_node);
  uint64_t highest = 0;
  for (const RankRole& span : role_spans(strategy_options, config, ranks, options.offload)) {
    try {
      const StrategyOutcome outcome =
          account_shapes(options, strategy_options, config, ranks, per_node, span.accounted, false, true);
      highest = std::max(highest, outcome.reserved_peak.front());
      if (first != nullptr && span.first == 0) *first = outcome;
    } catch (const OutOfMemoryError&) {
      return std::nullopt;
    }
  }
  return highest;
}

std::vector<Limit> find_limits(const RunOptions& options, int world, int ranks_per_node, const std::string& what) {
  const int ranks = options.plan_ranks > 0 ? options.plan_ranks : world;
  const int per_node = group_size(options, ranks, ranks_per_node);
  const bool batch = what == "micro-batch";
  const int64_t top =
      batch ? kMaxMicroBatch : (options.full.style == model::Style::kGpt2 ? options.full.max_positions : kMaxSeqLen);
  std::vector<Limit> limits;
  for (const strategy::StrategyOptions& strategy_options : options.strategies) {
    Limit limit;
    limit.strategy = strategy_options.name();
    limit.searched_up_to = top;
    const auto probe = [&](int64_t value, bool& fits) {
      model::ModelConfig config = options.full;
      (batch ? config.batch : config.seq) = value;
      return planned_peak(options, strategy_options, config, ranks, per_node, fits);
    };
    bool fits = false;
    uint64_t peak = probe(1, fits);
    if (!fits) {
      limit.peak_above = peak;
      limits.push_back(limit);
      continue;
    }
    int64_t good = 1, bad = 0;
    uint64_t good_peak = peak, bad_peak = 0;
    for (int64_t value = 2; value <= top; value = std::min(top, value * 2)) {
      peak = probe(value, fits);
      if (!fits) {
        bad = value;
        bad_peak = peak;
        break;
      }
      good = value;
      good_peak = peak;
      if (value == top) break;
    }
    while (bad != 0 && bad - good > 1) {
      const int64_t middle = good + (bad - good) / 2;
      peak = probe(middle, fits);
      (fits ? good : bad) = middle;
      (fits ? good_peak : bad_peak) = peak;
    }
    limit.largest = good;
    limit.peak_at_largest = good_peak;
    limit.peak_above = bad_peak;
    limits.push_back(limit);
  }
  return limits;
}

std::string format_limits(const RunOptions& options, int world, const std::string& what,
                          const std::vector<Limit>& limits) {
  const int ranks = options.plan_ranks > 0 ? options.plan_ranks : world;
  const uint64_t cap = options.cap.unlimited ? kNoCap : options.cap.bytes;
  std::string out = fmt::format(
      "\nlargest {} that fits, per strategy: {} on {} ranks, cap {} per GPU, {} {} (shapes only, full scale)\n", what,
      options.full.name, ranks, cap == kNoCap ? "none" : format_bytes(cap),
      what == "micro-batch" ? "seq-len" : "micro-batch", what == "micro-batch" ? options.full.seq : options.full.batch);
  out += fmt::format("{:<14} {:>10} {:>16} {:>22}\n", "strategy", what, "peak GiB there", "next step needs GiB");
  for (const Limit& limit : limits) {
    const auto gib = [](uint64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / kGiB); };
    if (limit.largest == 0) {
      out += fmt::format("{:<14} {:>10} {:>16} {:>22}\n", limit.strategy, "none", "-", gib(limit.peak_above));
    } else {
      out += fmt::format("{:<14} {:>10} {:>16} {:>22}\n", limit.strategy,
                         limit.peak_above == 0 ? fmt::format("{}+", limit.largest) : std::to_string(limit.largest),
                         gib(limit.peak_at_largest), limit.peak_above == 0 ? "-" : gib(limit.peak_above));
    }
  }
  return out;
}

std::string format_limits_json(const RunOptions& options, int world, const std::string& what,
                               const std::vector<Limit>& limits) {
  nlohmann::json root;
  root["schema_version"] = kJsonSchemaVersion;
  root["emu_version"] = EMU_VERSION;
  root["find_limit"] = what;
  root["model"] = options.full.name;
  root["ranks"] = options.plan_ranks > 0 ? options.plan_ranks : world;
  root["cap_bytes"] = options.cap.unlimited ? nlohmann::json(nullptr) : nlohmann::json(options.cap.bytes);
  nlohmann::json rows = nlohmann::json::array();
  for (const Limit& limit : limits) {
    rows.push_back({{"strategy", limit.strategy},
                    {"largest", limit.largest},
                    {"peak_bytes", limit.peak_at_largest},
                    {"next_peak_bytes", limit.peak_above},
                    {"searched_up_to", limit.searched_up_to}});
  }
  root["limits"] = rows;
  return root.dump(2) + "\n";
}

}  // namespace emu::app
