#include "app/run.h"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "app/one_strategy.h"
#include "app/step_time.h"
#include "app/timeline.h"
#include "collectives/nccl/select.h"
#include "emu/backend.h"
#include "emu/check.h"
#include "emu/device.h"
#include "emu/log.h"
#include "emu/topology.h"
#include "emu/units.h"
#include "strategies/strategy.h"
#include "workloads/data/synthetic.h"
#include "workloads/data/token_file.h"
#include "workloads/io/model_weights.h"
#include "workloads/model/layout.h"
#include "workloads/model/model.h"
#include "workloads/model/shrink.h"

namespace emu::app {
namespace {

// Gathers a trivially copyable vector from every rank onto rank 0.
template <typename T>
std::vector<std::vector<T>> gather_vectors(const std::vector<T>& mine, int rank, int world) {
  const int bytes = static_cast<int>(mine.size() * sizeof(T));
  std::vector<int> sizes(static_cast<size_t>(world));
  EMU_MPI_CHECK(MPI_Gather(&bytes, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::vector<int> offsets(static_cast<size_t>(world), 0);
  int total = 0;
  for (int r = 0; r < world; ++r) {
    offsets[r] = total;
    total += sizes[r];
  }
  std::vector<char> all(rank == 0 ? static_cast<size_t>(total) : 0);
  EMU_MPI_CHECK(
      MPI_Gatherv(mine.data(), bytes, MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE, 0, MPI_COMM_WORLD));
  std::vector<std::vector<T>> out;
  for (int r = 0; rank == 0 && r < world; ++r) {
    const T* begin = reinterpret_cast<const T*>(all.data() + offsets[r]);
    out.emplace_back(begin, begin + sizes[r] / sizeof(T));
  }
  return out;
}

// What in this run groups ranks by node: HYBRID_SHARD's shard and replica groups, the hierarchical all-reduce.
std::vector<std::string> node_users(const RunOptions& options) {
  std::vector<std::string> users;
  for (const strategy::StrategyOptions& one : options.strategies) {
    if (one.kind == strategy::StrategyKind::kFsdp && one.fsdp.sharding == strategy::Sharding::kHybridShard)
      users.push_back(one.name());
  }
  std::string_view rest = options.collectives;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    if (rest.substr(0, comma) == "all_reduce=hier") users.emplace_back("all_reduce=hier");
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return users;
}

// The ranks per node the run groups by: --ranks-per-node, else EMU_COLL_RANKS_PER_NODE, else the ranks MPI finds
// sharing a host (MPI_COMM_TYPE_SHARED). emu's node is L consecutive ranks (collectives/algorithm.h, node_size), so
// the hosts count only when they hold equal blocks of consecutive ranks (mpirun's default --map-by slot, torchrun).
// When they do not (mpirun --map-by node, hosts of different sizes), what needs nodes (node_users) is refused, on
// every rank alike, naming the placement and the fixes: NCCL would find the nodes whatever the ranks' order, but
// PyTorch's HSDP mesh (init_device_mesh) takes consecutive ranks as a node without checking, and would silently
// shard across hosts. Nothing needing nodes, the run goes on with each rank its own node (1), as before.
int ranks_per_node_of(const MpiSession& mpi, const RunOptions& options) {
  if (options.ranks_per_node > 0) return options.ranks_per_node;  // checked to divide the ranks (options.cpp)
  const int declared = coll::CommunicatorOptions::from_environment().ranks_per_node;
  if (declared > 0) {
    if (mpi.world() % declared != 0) {
      throw InputError(fmt::format("EMU_COLL_RANKS_PER_NODE={} does not divide the {} ranks; accepted: a divisor of {}",
                                   declared, mpi.world(), mpi.world()));
    }
    return declared;
  }
  const Placement placement = placement_of(mpi.host_of_ranks());
  if (placement.consecutive) return placement.ranks_per_host;
  const std::vector<std::string> users = node_users(options);
  if (!users.empty()) {
    throw InputError(fmt::format(
        "{} group ranks by node, a node being L consecutive ranks, but MPI placed the ranks otherwise ({}); "
        "launch with consecutive ranks on each host (mpirun --map-by slot, or --map-by ppr:L:node), or declare "
        "the node size with --ranks-per-node L (ranks r·L .. r·L + L - 1 are then a node, whatever the hosts)",
        fmt::join(users, " and "), placement.detail));
  }
  return 1;
}

struct Groups {
  std::unique_ptr<coll::Communicator> world, intra, inter, control;
  std::unique_ptr<coll::Communicator> post_forward;  // fsdp2's reshard_after_forward=M: M consecutive ranks
};

Groups make_groups(Device& device, const RunOptions& options, int ranks_per_node) {
  Groups groups;
  coll::CommunicatorOptions collective_options = coll::CommunicatorOptions::from_environment();
  collective_options.watchdog_seconds = options.watchdog_seconds;
  collective_options.shrink = options.shrink;
  collective_options.check_calls = collective_options.check_calls || options.check_collectives;
  // The nodes the hierarchical all-reduce keeps apart (ranks_per_node_of).
  collective_options.ranks_per_node = ranks_per_node;
  groups.world = coll::make_communicator(MPI_COMM_WORLD, device, "world", collective_options, options.collectives);
  const int rank = groups.world->rank();
  groups.intra = groups.world->split(rank / ranks_per_node, rank, fmt::format("intra-node {}", rank / ranks_per_node));
  groups.inter = groups.world->split(rank % ranks_per_node, rank, fmt::format("inter-node {}", rank % ranks_per_node));
  for (const strategy::StrategyOptions& one : options.strategies) {
    const int m = one.fsdp2.post_forward_ranks;
    if (m > 0 && groups.post_forward == nullptr) {
      groups.post_forward = groups.world->split(rank / m, rank, fmt::format("post-forward {}", rank / m));
    }
  }
  // The verdicts travel apart from the training traffic.
  groups.control = groups.world->split(0, rank, "control");
  return groups;
}

// What a run does around each step of one strategy: its tokens, the faults asked for, the slowest rank's time and
// the mean loss, the out-of-memory verdict agreed by every rank; at the end, the weights to save and every rank's
// peaks, traffic, timeline and spans, gathered on rank 0.
class RunDriver final : public StepDriver {
 public:
  // `file_tokens`: a token file to train on, or null for the strategy's seeded synthetic tokens.
  RunDriver(const MpiSession& mpi, const RunOptions& options, const RunReport& report,
            const strategy::StrategyOptions& strategy_options, const data::TokenSource* file_tokens, Device& device,
            Groups& groups, const SpanRecorder* spans)
      : mpi_(mpi),
        options_(options),
        report_(report),
        first_(&strategy_options == &options.strategies.front()),
        synthetic_(synthetic_config(strategy_options, report.model)),
        tokens_(file_tokens != nullptr ? *file_tokens : synthetic_),
        device_(device),
        groups_(groups),
        spans_(spans) {}

  std::vector<data::Batch> micro_batches(int step) override {
    const int64_t batch = report_.model.batch;
    std::vector<data::Batch> micro_batches;
    micro_batches.reserve(static_cast<size_t>(options_.accumulation));
    for (int m = 0; m < options_.accumulation; ++m) {
      micro_batches.push_back(tokens_.batch(step, data::sample_offset(mpi_.rank(), mpi_.world(), m, batch), batch));
    }
    return micro_batches;
  }

  // Micro-batch m of replica d of D holds samples (m·D + d)·b …: with one replica, m·b … m·b + b − 1, so that with
  // M = N × accumulation they are the samples the N data-parallel ranks hold between them (data::sample_offset).
  std::vector<data::Batch> replica_micro_batches(int step, int count, int replica, int replicas) override {
    const int64_t batch = report_.model.batch;
    std::vector<data::Batch> micro_batches;
    micro_batches.reserve(static_cast<size_t>(count));
    for (int m = 0; m < count; ++m) {
      micro_batches.push_back(tokens_.batch(step, data::sample_offset(replica, replicas, m, batch), batch));
    }
    return micro_batches;
  }

  void before_step(int step) override {
    inject_faults(options_.faults, mpi_.rank(), step + 1, first_,
                  [&] { groups_.world->barrier("fault: an extra barrier"); });
  }

  bool after_step(int step, const strategy::StepResult& result, StrategyOutcome& outcome) override {
    double seconds = result.seconds;
    float loss = result.loss;
    EMU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    EMU_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    outcome.step_seconds.push_back(seconds);
    outcome.losses.push_back(loss / static_cast<float>(mpi_.world()));
    outcome.grad_norms.push_back(result.grad_norm);  // the global norm: the same on every rank
    outcome.steps_run = step + 1;
    outcome.verdict = strategy::agree_on_oom(device_.memory(), *groups_.control);
    progress(outcome, step);
    return !outcome.verdict.any();  // it would not have run on the GPUs: stop with what it needed
  }

  void finish(StrategyOutcome& outcome, const model::Model& model, strategy::Strategy& strategy) override {
    // --steps 0: set-up only, whose out-of-memory verdict no step end has agreed on yet.
    if (outcome.steps_run == 0) outcome.verdict = strategy::agree_on_oom(device_.memory(), *groups_.control);
    if (!options_.save_weights_path.empty() && first_) save_weights(model, strategy, outcome);
    collect(outcome, strategy);
  }

 private:
  static data::SyntheticConfig synthetic_config(const strategy::StrategyOptions& strategy_options,
                                                const model::ModelConfig& model) {
    data::SyntheticConfig synthetic;
    synthetic.seed = strategy_options.seed;
    synthetic.vocab = model.vocab;
    synthetic.seq_len = model.seq;
    return synthetic;
  }

  // The strategy's whole weights (collective), written by rank 0 at once: the file is complete or absent.
  void save_weights(const model::Model& model, strategy::Strategy& strategy, const StrategyOutcome& outcome) const {
    std::vector<std::vector<float>> units;
    units.reserve(static_cast<size_t>(model.num_units()));
    for (int u = 0; u < model.num_units(); ++u) units.push_back(strategy.full_weights(u));
    if (mpi_.rank() != 0) return;
    io::save_model_weights(options_.save_weights_path, report_.model, units, DType::kF32,
                           {{"emu_model", report_.model.name},
                            {"emu_strategy", outcome.name},
                            {"emu_steps", std::to_string(outcome.steps_run)}});
    std::fprintf(stderr, "emu: saved %s's weights after %d step%s to %s (fp32, Hugging Face names)\n",
                 outcome.name.c_str(), outcome.steps_run, outcome.steps_run == 1 ? "" : "s",
                 options_.save_weights_path.c_str());
  }

  void progress(const StrategyOutcome& outcome, int step) const {
    if (mpi_.rank() != 0) return;
    const char* state = outcome.verdict.any() ? "out of memory" : "ok";
    // fmt pads by characters, not bytes: layout names hold "·" (two bytes in UTF-8).
    fmt::print(stderr, "emu: {:<13} step {}/{}  loss {:.4f}  {:.2f} s  {}\n", outcome.name, step + 1, options_.steps,
               outcome.losses.back(), outcome.step_seconds.back(), state);
    std::fflush(stderr);
  }

  void collect(StrategyOutcome& outcome, strategy::Strategy& strategy) {
    const MemoryPool& memory = device_.memory();
    const int rank = mpi_.rank();
    const int world = mpi_.world();
    const auto peaks = gather_vectors(
        std::vector<uint64_t>{memory.peak(), memory.reserved_peak(), memory.allocated_at_reserved_peak()}, rank, world);
    const auto categories = gather_vectors(std::vector<CategoryBytes>{memory.category_peaks()}, rank, world);
    const auto states = gather_vectors(std::vector<uint64_t>{outcome.prediction.model_state_bytes()}, rank, world);
    const auto predicted = gather_vectors(std::vector<CategoryBytes>{outcome.prediction.peak}, rank, world);
    const auto at_peak = gather_vectors(std::vector<CategoryBytes>{memory.breakdown_at_peak()}, rank, world);
    for (int r = 0; rank == 0 && r < world; ++r) {
      outcome.peak.push_back(peaks[r][0]);
      outcome.reserved_peak.push_back(peaks[r][1]);
      outcome.allocated_at_reserved_peak.push_back(peaks[r][2]);
      if (peaks[r][1] > outcome.reserved_peak[outcome.reserved_peak_rank]) outcome.reserved_peak_rank = r;
      outcome.category_peaks.push_back(categories[r][0]);
      outcome.predicted_states.push_back(states[r][0]);
      outcome.predicted_peaks.push_back(predicted[r][0]);
      outcome.at_peak.push_back(at_peak[r][0]);
      if (outcome.peak.back() > outcome.peak[outcome.peak_rank]) outcome.peak_rank = r;
    }
    const double steps = std::max(1, outcome.steps_run);
    for (coll::Communicator* group : strategy.groups()) {
      add_traffic_per_step(outcome, *group, steps);
      if (rank == 0) record_phase_traffic(outcome, *group, steps);
    }
    outcome.host_per_step = {static_cast<uint64_t>(strategy.host_traffic().device_to_host / steps),
                             static_cast<uint64_t>(strategy.host_traffic().host_to_device / steps)};
    if (!options_.trace_path.empty() || !options_.svg_path.empty()) {
      const MemorySeries series = thin_timeline(memory.timeline());
      const auto seconds = gather_vectors(series.seconds, rank, world);
      const auto current = gather_vectors(series.current, rank, world);
      const auto reserved = gather_vectors(series.reserved, rank, world);
      for (int r = 0; rank == 0 && r < world; ++r) outcome.memory.push_back({seconds[r], current[r], reserved[r]});
      const auto& oom = memory.first_oom();
      const auto oom_seconds = gather_vectors(std::vector<double>{oom ? oom->seconds : -1.0}, rank, world);
      for (int r = 0; rank == 0 && r < world; ++r) outcome.oom_seconds.push_back(oom_seconds[r][0]);
    }
    if (spans_ != nullptr) {
      const auto packed = gather_vectors(pack_spans(spans_->spans()), rank, world);
      const auto dropped = gather_vectors(std::vector<uint64_t>{spans_->dropped()}, rank, world);
      for (int r = 0; rank == 0 && r < world; ++r) {
        outcome.spans.push_back(unpack_spans(packed[r]));
        outcome.spans_dropped.push_back(dropped[r][0]);
        if (dropped[r][0] > 0) {
          std::fprintf(stderr, "emu: trace: %s, rank %d: kept the first %zu spans, dropped %llu more\n",
                       outcome.name.c_str(), r, kMaxSpansPerRank, static_cast<unsigned long long>(dropped[r][0]));
        }
      }
    }
  }

  const MpiSession& mpi_;
  const RunOptions& options_;
  const RunReport& report_;
  const bool first_;  // the first strategy: the one faults strike and whose weights are saved
  const data::SyntheticTokens synthetic_;
  const data::TokenSource& tokens_;
  Device& device_;
  Groups& groups_;
  const SpanRecorder* spans_;
};

// One strategy on this rank's emulated GPU, with every rank. `file_tokens`: a token file to train on, or null for
// the strategy's seeded synthetic tokens; `weights`: loaded initial weights, or null for the seeded initialisation.
StrategyOutcome run_one(const MpiSession& mpi, const RunOptions& options, const RunReport& report,
                        const data::TokenSource* file_tokens,
                        const std::shared_ptr<const std::vector<std::vector<float>>>& weights,
                        const strategy::StrategyOptions& strategy_options) {
  MemoryPool::Options memory;
  memory.cap = report.cap;
  memory.reserve = report.reserve;
  memory.mode = options.strict_oom ? OomMode::kStrict : OomMode::kRecord;
  memory.rank = mpi.rank();
  memory.allocator = options.allocator;
  memory.alloc_conf = options.alloc_conf;
  memory.scale = static_cast<uint64_t>(report.shrink) * static_cast<uint64_t>(report.shrink);
  // The trace's zero: the memory timeline counts from the pool's making, just after this.
  std::optional<SpanRecorder> spans;
  if (!options.trace_path.empty() || !options.svg_path.empty()) spans.emplace(steady_seconds());  // the svg's phases
  auto device = make_device(options.device, memory, mpi.local_rank());
  device->memory().set_strategy(strategy_options.name());
  auto host = make_cpu_device({});  // optimizer offload's host memory, off the cap
  Groups groups = make_groups(*device, options, report.ranks_per_node);
  log::phase_end(fmt::format("{}: device and communicators", strategy_options.name()));
  const Stage stage{.device = *device,
                    .offload = options.offload ? host.get() : nullptr,
                    .parameter_host = strategy_options.zero.offload_param ? host.get() : nullptr,
                    .world = *groups.world,
                    .intra = groups.intra.get(),
                    .inter = groups.inter.get(),
                    .post_forward = groups.post_forward.get(),
                    .control = groups.control.get(),
                    .model = report.model,
                    .model_options = options.model_options,
                    .initial_weights = weights,
                    .shrink = report.shrink,
                    .ranks = mpi.world(),
                    .ranks_per_node = report.ranks_per_node,
                    .accumulation = options.accumulation,
                    .pipeline_micro_batches = pipeline_micro_batches(options, mpi.world()),
                    .steps = options.steps,
                    .spans = spans ? &*spans : nullptr};
  RunDriver driver(mpi, options, report, strategy_options, file_tokens, *device, groups, stage.spans);
  return run_one_strategy(stage, strategy_options, driver);
}

// The seeded initial weights of every unit, drawn once for a run of several strategies that share the seed: each
// strategy then copies its elements from here (Model::initial_values) instead of drawing them again, the same
// values (init_unit_range draws element i of a unit from (seed, unit, i) alone). Each rank draws 1/N of every unit
// and an all-gather (a copy, no arithmetic) gives every rank the rest: a world of N draws each element once instead
// of N times. Null for a model too large to hold a copy of on the host, whose strategies draw as before.
std::shared_ptr<const std::vector<std::vector<float>>> seeded_weights(const model::ModelConfig& config, uint64_t seed,
                                                                      int rank, int world) {
  constexpr uint64_t kMostElements = uint64_t{16} << 20;  // 64 MiB of fp32 per rank; keeps MPI's counts in an int
  const std::vector<model::UnitLayout> layouts = model::build_layouts(config);
  uint64_t elements = 0;
  for (const model::UnitLayout& unit : layouts) elements += unit.count;
  if (elements > kMostElements) return nullptr;
  auto weights = std::make_shared<std::vector<std::vector<float>>>(layouts.size());
  std::vector<int> counts(static_cast<size_t>(world));
  std::vector<int> offsets(static_cast<size_t>(world));
  for (size_t u = 0; u < layouts.size(); ++u) {
    const size_t n = layouts[u].count;
    for (int r = 0; r < world; ++r) {  // rank r draws elements [r·n/N, (r+1)·n/N)
      offsets[r] = static_cast<int>(n * static_cast<size_t>(r) / static_cast<size_t>(world));
      counts[r] = static_cast<int>(n * static_cast<size_t>(r + 1) / static_cast<size_t>(world)) - offsets[r];
    }
    std::vector<float>& values = (*weights)[u];
    values.resize(n);
    model::init_unit_range(layouts[u], static_cast<int>(u), seed, static_cast<size_t>(offsets[rank]),
                           static_cast<size_t>(counts[rank]), values.data() + offsets[rank]);
    EMU_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), counts.data(), offsets.data(),
                                 MPI_FLOAT, MPI_COMM_WORLD));
  }
  return weights;
}

}  // namespace

std::string group_kind(const std::string& communicator_name) {
  const size_t space = communicator_name.find_last_of(' ');
  if (space == std::string::npos) return communicator_name;
  const std::string tail = communicator_name.substr(space + 1);
  const bool number = !tail.empty() && tail.find_first_not_of("0123456789") == std::string::npos;
  return number ? communicator_name.substr(0, space) : communicator_name;
}

std::string RunReport::rank_words(const StrategyOutcome& outcome, size_t index) const {
  if (outcome.roles.empty()) return fmt::format("rank {}", index);
  const RankRole& role = outcome.roles.at(index);
  if (role.ranks() == world) return fmt::format("any of the {} ranks", world);
  if (role.ranks() == 1) return fmt::format("rank {}", role.first);
  if (role.bound)
    return fmt::format("ranks {}-{} (rank {}, the one holding the most)", role.first, role.last, role.accounted);
  return fmt::format("ranks {}-{}", role.first, role.last);
}

void mark_progress(RunReport& report, size_t done, double seconds) {
  report.seconds = seconds;
  report.not_run.clear();
  for (size_t i = done; i < report.options.strategies.size(); ++i) {
    report.not_run.push_back(report.options.strategies[i].name());
  }
  report.complete = report.not_run.empty();
}

RunReport run_strategies(const MpiSession& mpi, const RunOptions& options, const AfterStrategy& after_each) {
  EMU_CHECK(!options.plan, "run_strategies runs; a plan goes to plan_strategies");
  const auto start = std::chrono::steady_clock::now();
  RunReport report;
  report.options = options;
  report.world = mpi.world();
  report.hosts = mpi.hosts();
  report.ranks_per_node = ranks_per_node_of(mpi, options);
  report.shrink = options.shrink;
  report.model = model::shrink(options.full, options.shrink);
  const uint64_t k2 = static_cast<uint64_t>(options.shrink) * static_cast<uint64_t>(options.shrink);
  report.cap = options.cap.per_rank_bytes(options.shrink);
  report.reserve = options.reserve_full_scale / k2;
  if (report.cap != kNoCap && report.reserve > report.cap) {
    throw InputError(fmt::format("--reserve {} is more than the cap {} it is part of", format_bytes(report.reserve),
                                 format_bytes(report.cap)));
  }
  // Data and initial weights are read once, before any strategy runs; a bad file is bad input on every rank.
  std::unique_ptr<data::TokenFile> tokens;
  std::shared_ptr<const std::vector<std::vector<float>>> weights;
  if (!options.tokens_path.empty()) {
    data::TokenFileConfig config;
    config.path = options.tokens_path;
    config.width = options.token_bits == 32 ? data::TokenWidth::kU32 : data::TokenWidth::kU16;
    config.vocab = options.full.vocab;
    config.fold_vocab = report.model.vocab;
    config.seq_len = report.model.seq;
    config.seed = options.strategies.front().seed;
    tokens = std::make_unique<data::TokenFile>(config);
  }
  if (!options.load_weights_path.empty()) {
    try {
      weights = std::make_shared<const std::vector<std::vector<float>>>(
          io::load_model_weights(options.load_weights_path, report.model));
    } catch (const InputError& error) {
      if (report.shrink == 1) throw;
      throw InputError(
          fmt::format("{} (the run's shapes are {} shrunk by k = {}: weights of the full-size model "
                      "load with --shrink 1)",
                      error.what(), options.full.name, report.shrink));
    }
  }
  std::shared_ptr<const std::vector<std::vector<float>>> seeded;
  if (weights == nullptr && options.strategies.size() > 1) {
    seeded = seeded_weights(report.model, options.strategies.front().seed, mpi.rank(), mpi.world());
  }
  log::phase_end("initial weights");
  for (const strategy::StrategyOptions& strategy_options : options.strategies) {
    const bool same_seed = seeded != nullptr && strategy_options.seed == options.strategies.front().seed;
    report.outcomes.push_back(
        run_one(mpi, options, report, tokens.get(), same_seed ? seeded : weights, strategy_options));
    mark_progress(report, report.outcomes.size(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (after_each) after_each(report);
  }
  return report;
}

}  // namespace emu::app
