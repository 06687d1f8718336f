#include "app/step_time.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>

#include "collectives/communicator.h"
#include "emu/check.h"
#include "strategies/strategy.h"
#include "workloads/model/layout.h"
#include "workloads/model/shrink.h"
#include "workloads/model/tensor_parallel.h"

namespace emu::app {
namespace {

bool starts_with(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

// The trailing number of a label after `word` ("backward reduce-scatter, unit 7" → 7), if any.
std::optional<long> number_after(std::string_view label, std::string_view word) {
  const size_t at = label.rfind(word);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view digits = label.substr(at + word.size());
  long value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error != std::errc() || end == digits.data()) return std::nullopt;
  return value;
}

// Where a collective sits in the step, read from the phase it was issued in (step_time.h).
enum class Place : uint8_t { kForwardUnit, kBackwardBefore, kBackwardAfter, kBackwardBucket, kPipeline, kExposed };

struct PlacedPhase {
  Place place = Place::kExposed;
  long unit = -1;    // kForwardUnit, kBackwardBefore, kBackwardAfter
  double order = 0;  // kBackwardBucket: the order buckets become ready in
  double calls = 0;
  double per_call = 0;  // seconds
};

PlacedPhase place(const PhaseTraffic& p) {
  PlacedPhase placed;
  placed.calls = p.calls;
  const std::optional<long> unit = number_after(p.phase, "unit ");
  if (p.kind == coll::CollectiveKind::kSend || p.kind == coll::CollectiveKind::kRecv) {
    placed.place = Place::kPipeline;
  } else if (starts_with(p.phase, "forward") && unit) {
    placed = {Place::kForwardUnit, *unit, 0, p.calls, 0};
  } else if (starts_with(p.phase, "backward") && unit) {
    // "backward all-gather, unit u" is fetched before the unit's backward; its reduce-scatter (and HSDP's
    // all-reduce across replicas) follows it.
    placed = {p.kind == coll::CollectiveKind::kAllGather ? Place::kBackwardBefore : Place::kBackwardAfter, *unit, 0,
              p.calls, 0};
  } else if (starts_with(p.phase, "backward")) {
    // DDP's "bucket i" are ready in index order; ZeRO-2's reduce buckets ("units from flat element x") from the
    // end of the flat buffer backwards.
    placed.place = Place::kBackwardBucket;
    if (const auto bucket = number_after(p.phase, "bucket ")) placed.order = double(*bucket);
    if (const auto element = number_after(p.phase, "flat element ")) placed.order = -double(*element);
  }
  return placed;
}

// Calls of a phase in micro-batch j of m: every micro-batch when it ran at least m times, else the last ones
// (DDP's no_sync accumulation reduces only in the last).
double calls_in(double calls, int j, int m) {
  if (calls >= m) return calls / m;
  return j >= m - static_cast<int>(std::lround(calls)) ? 1.0 : 0.0;
}

double seconds_of(const std::vector<model::OpCost>& ops, const StepTimeSetting& setting, DType compute) {
  double sum = 0;
  for (const model::OpCost& op : ops) sum += op_seconds(op, setting, compute);
  return sum;
}

double positive_fraction(std::string_view key, std::string_view text, bool fraction) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  const bool ok = error == std::errc() && end == text.data() + text.size() && value > 0 && (!fraction || value <= 1);
  if (!ok) {
    throw InputError(fmt::format("--achievable {}={} is out of range; accepted: {}", key, text,
                                 fraction ? "a fraction in (0, 1]" : "a positive number of parameters per second"));
  }
  return value;
}

// What a message with no split stated goes over: the node's link on one node, else the flat link (cost.h, Fabric).
const coll::LinkModel& unsplit_link(const coll::Fabric& fabric, int ranks) {
  if (coll::node_size(fabric.ranks_per_node, ranks) >= ranks) return fabric.node;
  return fabric.flat ? *fabric.flat : fabric.network;
}

}  // namespace

Achievable achievable_for(const Hardware& hardware) {
  // Shared by every generation: HBM streams at about 80% of the datasheet (assumed); NVLink carries about 80% of
  // its peak as application data after packet overheads (NCCL's maintainers, github.com/NVIDIA/nccl/issues/1054),
  // which nccl-tests' all-reduce bus bandwidth on 8 A100s confirms (README); an InfiniBand NIC about 90% and a PCIe
  // x16 copy about 80% of the link (assumed). The host's AdamW (DeepSpeed's CPU Adam) is assumed to update 1e9
  // parameters per second, not checked against a measurement.
  Achievable a{.matmul = 0.7,
               .attention = 0.5,
               .memory = 0.8,
               .intra_link = 0.8,
               .inter_link = 0.9,
               .host_link = 0.8,
               .cpu_adam_params_per_s = 1e9,
               .basis = ""};
  const std::string& name = hardware.name;
  // The linears' fraction is what a whole training step gets from them, not a lone GEMM's best (which reaches
  // 80-90% of the peak): kernel gaps, shapes that tile badly and the optimizer's launches all lower it. One
  // published row per generation set it, every other row of the README's table is a prediction: A100 0.6 from
  // torchtitan's Llama 2 13B without checkpointing on 64 A100s (2162 tokens/s per GPU, docs/performance.md), H100
  // 0.5 from llm-foundry's MPT-7B without checkpointing on 8 H100s (10643, scripts/train/benchmarking/README.md).
  // Attention: FlashAttention-2 reaches 50-73% of A100's peak forward and backward (Dao 2023, abstract) and about
  // 35% of H100's (Shah et al. 2024, "FlashAttention-3", §1).
  if (starts_with(name, "a100")) {
    a.matmul = 0.6;
    a.attention = 0.6;
    a.basis = "A100: linears 60% of peak (set by torchtitan's Llama 2 13B row), FlashAttention-2 60% (Dao 2023)";
  } else if (starts_with(name, "h100") || starts_with(name, "h200")) {
    a.matmul = 0.5;
    a.attention = 0.4;
    a.basis = "H100/H200: linears 50% of peak (set by llm-foundry's MPT-7B row), FlashAttention-2 40% (Shah 2024)";
  } else {
    a.matmul = 0.55;
    a.basis = "generic: linears 55% of peak, attention 50%";
  }
  a.basis += ", HBM 80%, NVLink 80%, network 90%, PCIe 80%, CPU Adam 1e9 params/s";
  return a;
}

Achievable parse_achievable(std::string_view spec, Achievable base) {
  static const std::map<std::string, double Achievable::*, std::less<>> kFractions = {
      {"matmul", &Achievable::matmul},         {"attention", &Achievable::attention},
      {"memory", &Achievable::memory},         {"intra_link", &Achievable::intra_link},
      {"inter_link", &Achievable::inter_link}, {"host_link", &Achievable::host_link}};
  std::vector<std::string> set;
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    const std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    const size_t equals = item.find('=');
    const std::string_view key = item.substr(0, equals);
    const std::string_view value = equals == std::string_view::npos ? std::string_view() : item.substr(equals + 1);
    if (key == "cpu_adam") {
      base.cpu_adam_params_per_s = positive_fraction(key, value, false);
    } else if (const auto field = kFractions.find(key); field != kFractions.end()) {
      base.*(field->second) = positive_fraction(key, value, true);
    } else {
      throw InputError(fmt::format(
          "--achievable: unknown key '{}'; accepted: matmul, attention, memory, intra_link, inter_link, host_link, "
          "cpu_adam (e.g. matmul=0.7,attention=0.5)",
          key));
    }
    set.push_back(std::string(item));
  }
  if (!set.empty()) base.basis += fmt::format("; set by --achievable: {}", fmt::join(set, ", "));
  return base;
}

double op_seconds(const model::OpCost& op, const StepTimeSetting& setting, DType compute) {
  const Hardware& hw = setting.hardware;
  const Achievable& a = setting.achievable;
  const double peak = (compute == DType::kF32 ? hw.fp32_tflops : hw.bf16_dense_tflops) * 1e12;
  const double fraction = op.op_class == model::OpClass::kAttention ? a.attention : a.matmul;
  const double math = op.op_class == model::OpClass::kMemory ? 0.0 : op.flops / (fraction * peak);
  const double memory = op.bytes / (a.memory * hw.hbm_gb_per_s * 1e9);
  return std::max(math, memory);
}

Reach reach_of(std::string_view group, int group_size, int world, int gpus_per_node) {
  if (world <= gpus_per_node || group == "intra-node") return Reach::kInsideNode;
  // tp's and pp's groups are consecutive ranks (strategy.h ParallelOptions): inside a node when they fit in one.
  if ((group == "tensor-parallel" || group == "pipeline") && group_size <= gpus_per_node) return Reach::kInsideNode;
  if (group == "inter-node") return Reach::kOneGpuPerNode;
  const int nodes = (world + gpus_per_node - 1) / gpus_per_node;
  return group_size > nodes ? Reach::kWholeNodes : Reach::kOneGpuPerNode;
}

coll::LinkModel link_for(const StepTimeSetting& setting, Reach span, int ranks) {
  const Hardware& hw = setting.hardware;
  const Achievable& a = setting.achievable;
  const double nvlink = a.intra_link * hw.intra_node.gb_per_s_per_direction * 1e9;
  const double nic = a.inter_link * hw.inter_node.gb_per_s_per_direction * 1e9;
  switch (span) {
    case Reach::kInsideNode: return {hw.intra_node.step_latency_us * 1e-6, 1 / nvlink, 0};
    case Reach::kOneGpuPerNode: return {hw.inter_node.step_latency_us * 1e-6, 1 / nic, 0};
    case Reach::kWholeNodes: {
      const int node = std::max(1, setting.gpus_per_node);
      const int nodes = (ranks + node - 1) / node;
      const double crossing = std::min(1.0, double(nodes) / std::max(1, ranks));
      const double alpha =
          (crossing * hw.inter_node.step_latency_us + (1 - crossing) * hw.intra_node.step_latency_us) * 1e-6;
      return {alpha, 1 / std::min(nvlink, nic * node), 0};
    }
  }
  return {};
}

coll::Fabric fabric_for(const StepTimeSetting& setting, Reach span, int ranks) {
  const coll::LinkModel link = link_for(setting, span, ranks);
  const int per_node = std::max(1, setting.gpus_per_node);
  if (span != Reach::kWholeNodes || ranks % per_node != 0) return {link, link, 0, std::nullopt};
  return {link_for(setting, Reach::kInsideNode), link_for(setting, Reach::kOneGpuPerNode), per_node, link};
}

double collective_seconds(coll::CollectiveKind kind, std::string_view algorithm, double payload, int ranks,
                          const coll::Fabric& fabric, double call_latency) {
  if (ranks <= 1) return 0;
  const coll::LinkModel& link = unsplit_link(fabric, ranks);
  if (kind == coll::CollectiveKind::kSend || kind == coll::CollectiveKind::kRecv) {
    return call_latency + link.alpha + payload * link.beta;
  }
  const coll::Algorithm* chosen = coll::find_algorithm(kind, algorithm);
  if (chosen == nullptr || chosen->cost == nullptr) chosen = coll::find_algorithm(kind, "ring");
  if (chosen == nullptr || chosen->cost == nullptr) {
    // Kinds without a ring of ours (barrier, ...): a tree's 2·log2 N rounds of the whole payload.
    const double rounds = 2 * std::ceil(std::log2(double(ranks)));
    return call_latency + rounds * (link.alpha + payload * link.beta);
  }
  // An algorithm whose pieces pipeline (the ring reduce) is timed cut into the communicator's slices, as the
  // library cuts its chunks.
  const coll::Cost cost = chosen->sliced_cost != nullptr
                              ? chosen->sliced_cost(payload, ranks, fabric.ranks_per_node,
                                                    static_cast<double>(coll::CommunicatorOptions{}.slice_bytes))
                              : chosen->cost(payload, ranks, fabric.ranks_per_node);
  return call_latency + coll::predicted_seconds(cost, fabric, ranks);
}

double collective_seconds(coll::CollectiveKind kind, std::string_view algorithm, double payload, int ranks,
                          const coll::LinkModel& link, double call_latency) {
  return collective_seconds(kind, algorithm, payload, ranks, coll::Fabric{link, link, 0, std::nullopt}, call_latency);
}

Timeline overlap(std::span<const Chunk> chunks, std::vector<PredictedSpan>* spans) {
  Timeline t;
  if (chunks.empty()) return t;
  const auto record = [&](const std::string& name, bool communication, double start, double end) {
    if (spans != nullptr && end > start) spans->push_back({name, communication, start, end});
  };
  // The first piece's `before` is issued at 0; piece i+1's when piece i starts computing (one prefetch in
  // flight); piece i's `after` when it stops. One communication stream serves them in that order.
  double comm_free = chunks[0].before;
  record("all-gather for " + chunks[0].name, true, 0, comm_free);
  double gathered = comm_free;  // when piece i's `before` has arrived
  double compute_end = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const double start = std::max(compute_end, gathered);
    if (i + 1 < chunks.size()) {
      const double issued = std::max(comm_free, start);
      comm_free = issued + chunks[i + 1].before;
      record("all-gather for " + chunks[i + 1].name, true, issued, comm_free);
      gathered = comm_free;
    }
    compute_end = start + chunks[i].compute;
    record(chunks[i].name, false, start, compute_end);
    if (chunks[i].after > 0) {
      const double issued = std::max(comm_free, compute_end);
      comm_free = issued + chunks[i].after;
      record("gradient reduction after " + chunks[i].name, true, issued, comm_free);
    }
    t.compute += chunks[i].compute;
  }
  t.seconds = std::max(compute_end, comm_free);
  return t;
}

namespace {

// Seconds of one block's and the root's forward and backward (the recomputed forward under checkpointing, the
// recomputed attention core under selective recomputation).
struct UnitSeconds {
  double block_forward = 0, block_backward = 0, root_forward = 0, root_backward = 0;
};

UnitSeconds unit_seconds(const model::ModelConfig& full, const model::ModelOptions& o, const StepTimeSetting& setting) {
  UnitSeconds u;
  u.block_forward = seconds_of(model::block_forward_ops(full, o), setting, o.compute);
  u.block_backward = seconds_of(model::block_backward_ops(full, o), setting, o.compute);
  if (o.checkpoint) {
    u.block_backward += u.block_forward;
  } else if (o.selective_recompute) {  // the attention core's forward once more (blocks.h, selective recomputation)
    std::vector<model::OpCost> core;
    for (const model::OpCost& op : model::block_forward_ops(full, o)) {
      if (op.op_class == model::OpClass::kAttention) core.push_back(op);
    }
    u.block_backward += seconds_of(core, setting, o.compute);
  }
  u.root_forward = seconds_of(model::root_forward_ops(full, o), setting, o.compute);
  u.root_backward = seconds_of(model::root_backward_ops(full, o), setting, o.compute);
  return u;
}

// Every collective of the step, placed and timed per call at full scale.
std::vector<PlacedPhase> timed_phases(const StrategyOutcome& outcome, int world, double scale,
                                      const StepTimeSetting& setting) {
  const int node = std::max(1, setting.gpus_per_node);
  const double call_latency = setting.hardware.call_latency_us * 1e-6;
  std::vector<PlacedPhase> phases;
  for (const PhaseTraffic& p : outcome.phase_traffic) {
    if (p.calls <= 0 || p.group_size <= 1) continue;
    const Reach reach = reach_of(p.group, p.group_size, world, node);
    // A receive waits for its send's bytes, which the send's phase times: the receive itself costs its latency.
    const double payload = p.kind == coll::CollectiveKind::kRecv ? 0 : static_cast<double>(p.payload) * scale / p.calls;
    PlacedPhase placed = place(p);
    // Only the world's communicator knows its nodes (collectives/communicator.h, split: a group split off is one
    // node), so only there does the hierarchical all-reduce keep them apart; elsewhere it runs as the ring.
    const coll::LinkModel link = link_for(setting, reach, p.group_size);
    const coll::Fabric fabric =
        p.group == "world" ? fabric_for(setting, reach, p.group_size) : coll::Fabric{link, link, 0, std::nullopt};
    placed.per_call = collective_seconds(p.kind, p.algorithm, payload, p.group_size, fabric, call_latency);
    phases.push_back(placed);
  }
  return phases;
}

double total_seconds(const std::vector<PlacedPhase>& phases, std::optional<Place> only = std::nullopt) {
  double sum = 0;
  for (const PlacedPhase& p : phases) sum += !only || p.place == *only ? p.per_call * p.calls : 0.0;
  return sum;
}

// The optimizer on the rank's shard, on the GPU, or (offloaded) the PCIe bytes and the host's AdamW: {GPU seconds,
// offload seconds}. The shard is its m and v as measured, or, offloaded, the parameters the rank owns; AdamW
// reads and writes the weights (the fp32 master where there is one), m and v, and reads the gradients.
std::pair<double, double> optimizer_seconds(const RunOptions& run, int world, const StrategyOutcome& outcome,
                                            const strategy::StrategyOptions& options, double scale,
                                            const StepTimeSetting& setting) {
  const optim::PrecisionRecipe& recipe = options.recipe;
  const double moment_bytes = static_cast<double>(recipe.bytes_per_param(Category::kOptimizerState));
  const double state = outcome.category_peaks.empty()
                           ? 0.0
                           : static_cast<double>(outcome.category_peaks[0][Category::kOptimizerState]) * scale;
  const bool replicated =
      options.kind == strategy::StrategyKind::kDdp || options.kind == strategy::StrategyKind::kZero0 ||
      (options.kind == strategy::StrategyKind::kFsdp && options.fsdp.sharding == strategy::Sharding::kNoShard);
  const double owned = state > 0 && moment_bytes > 0
                           ? state / moment_bytes
                           : static_cast<double>(model::parameter_count(run.full)) / (replicated ? 1 : world);
  if (run.offload) {
    const double pcie =
        static_cast<double>(outcome.host_per_step.device_to_host + outcome.host_per_step.host_to_device) * scale;
    return {0.0, pcie / (setting.achievable.host_link * setting.hardware.host.gb_per_s_per_direction * 1e9) +
                     owned / setting.achievable.cpu_adam_params_per_s};
  }
  const double weight_bytes = recipe.has_master ? 4.0 : static_cast<double>(dtype_size(recipe.params));
  const double adam_bytes = 2 * weight_bytes + 2 * moment_bytes + static_cast<double>(dtype_size(recipe.grads)) +
                            (recipe.has_master ? static_cast<double>(dtype_size(recipe.params)) : 0.0);
  return {owned * adam_bytes / (setting.achievable.memory * setting.hardware.hbm_gb_per_s * 1e9), 0.0};
}

// Micro-batch j's pieces, appended to `chunks`: forward (the embedding, the blocks, the head and loss), then
// backward (the head, the blocks in reverse, the embedding), each with the collectives of its unit; the
// bucketed ones spread over backward in the order their buckets fill.
void add_micro_batch(std::vector<Chunk>& chunks, const std::vector<PlacedPhase>& phases, const UnitSeconds& u,
                     int layers, int j, int m) {
  const std::string mb = m > 1 ? fmt::format("micro-batch {}, ", j + 1) : std::string();
  const size_t forward_begin = chunks.size();
  chunks.push_back({0, 0, 0, mb + "forward, embedding"});  // needs the root unit
  for (int l = 1; l <= layers; ++l)
    chunks.push_back({u.block_forward, 0, 0, fmt::format("{}forward, block {}", mb, l)});
  chunks.push_back({u.root_forward, 0, 0, mb + "forward, head and loss"});
  const size_t backward_begin = chunks.size();
  chunks.push_back({u.root_backward, 0, 0, mb + "backward, head and loss"});
  for (int l = layers; l >= 1; --l)
    chunks.push_back({u.block_backward, 0, 0, fmt::format("{}backward, block {}", mb, l)});
  chunks.push_back({0, 0, 0, mb + "backward, embedding"});  // the root's gradients are complete after it
  const size_t backward_count = chunks.size() - backward_begin;
  // A unit's piece: unit 0 (the root) is the first forward piece and the first and last backward ones.
  const auto backward_chunk = [&](long unit, bool after) {
    if (unit == 0) return after ? chunks.size() - 1 : backward_begin;
    return backward_begin + static_cast<size_t>(layers - unit + 1);
  };
  std::vector<const PlacedPhase*> buckets;
  for (const PlacedPhase& p : phases) {
    const double time = calls_in(p.calls, j, m) * p.per_call;
    const bool unit = p.unit >= 0 && p.unit <= layers;
    if (time <= 0) continue;
    if (p.place == Place::kForwardUnit && unit) chunks[forward_begin + static_cast<size_t>(p.unit)].before += time;
    if (p.place == Place::kBackwardBefore && unit) chunks[backward_chunk(p.unit, false)].before += time;
    if (p.place == Place::kBackwardAfter && unit) chunks[backward_chunk(p.unit, true)].after += time;
    if (p.place == Place::kBackwardBucket) buckets.push_back(&p);
  }
  // Buckets fill at an even pace through backward: bucket i of B is ready after (i+1)/B of its pieces.
  std::stable_sort(buckets.begin(), buckets.end(),
                   [](const PlacedPhase* a, const PlacedPhase* b) { return a->order < b->order; });
  for (size_t i = 0; i < buckets.size(); ++i) {
    const auto at =
        static_cast<size_t>(std::lround(double(i + 1) / double(buckets.size()) * double(backward_count - 1)));
    chunks[backward_begin + std::min(at, backward_count - 1)].after +=
        calls_in(buckets[i]->calls, j, m) * buckets[i]->per_call;
  }
}

}  // namespace

StepTime predict_step_time(const RunOptions& run, int world, const StrategyOutcome& outcome,
                           const StepTimeSetting& setting, uint64_t scale_factor) {
  const model::ModelConfig& full = run.full;
  const strategy::StrategyOptions options = strategy::with_framework_recipe(outcome.options);
  const model::ModelOptions model_options = strategy::framework_model_options(options, run.model_options);
  // Tensor parallelism: each GPU of a TP group of T runs its slice of every layer (a/T heads, F/T, V'/T), the
  // norms and the residual stream whole, on the group's micro-batch; per GPU its tokens and FLOPs are 1/T of them.
  const int tensor = strategy::mesh_of(options, world, 0).tensor;
  const UnitSeconds u =
      unit_seconds(tensor > 1 ? model::tensor_parallel_config(full, tensor) : full, model_options, setting);
  const double scale = static_cast<double>(scale_factor);
  const std::vector<PlacedPhase> phases = timed_phases(outcome, world, scale, setting);
  const double exposed_phases = total_seconds(phases, Place::kExposed);
  const double pipeline_p2p = total_seconds(phases, Place::kPipeline);
  StepTime st;
  st.communication = total_seconds(phases);
  const auto [optimizer, offload] = optimizer_seconds(run, world, outcome, options, scale, setting);
  st.offload = offload;

  const auto layers = static_cast<int>(full.layers);
  double tokens = 0;
  if (strategy::pipelined(options)) {
    // Each stage runs its share of the blocks (the last also the head and loss: the slowest), in M + P − 1 slots.
    // Interleaved (V chunks): V·M + P − 1 slots of a chunk's share, 1/V of the stage's (Narayanan et al. 2021).
    const int stages = strategy::mesh_of(options, world, 0).pipeline;
    const int chunks = options.pipeline.virtual_stages;
    const int micro_batches = pipeline_micro_batches(run, world);
    const double blocks = std::ceil(double(layers) / stages);
    const double slot_compute = blocks * (u.block_forward + u.block_backward) + u.root_forward + u.root_backward;
    const double slot = slot_compute + pipeline_p2p / micro_batches;
    st.compute = micro_batches * slot_compute + optimizer;
    st.bubble = (stages - 1) * slot / chunks;
    st.exposed_communication = pipeline_p2p + exposed_phases;
    st.seconds = micro_batches * slot + st.bubble + optimizer + exposed_phases + st.offload;
    const double busy = micro_batches * slot, filled = busy + st.bubble;
    st.spans = {{fmt::format("{} micro-batches through the slowest stage", micro_batches), false, 0, busy},
                {"pipeline bubble (fill and drain)", false, busy, filled},
                {"collectives after backward", true, filled, filled + exposed_phases},
                {"optimizer step and offload", false, filled + exposed_phases, st.seconds}};
    st.pipeline = strategy::pipeline_timeline(
        options.pipeline.schedule, stages, micro_batches,
        (blocks * u.block_forward + u.root_forward + pipeline_p2p / micro_batches / 2) / chunks,
        (blocks * u.block_backward + u.root_backward + pipeline_p2p / micro_batches / 2) / chunks, chunks);
    st.pipeline_chunks = chunks;
    tokens = micro_batches * static_cast<double>(full.tokens()) / stages / tensor;
    st.model_flops = model::step_flops(full) * micro_batches / stages / tensor;
  } else {
    const int m = std::max(1, run.accumulation);
    std::vector<Chunk> chunks;
    for (int j = 0; j < m; ++j) add_micro_batch(chunks, phases, u, layers, j, m);
    const Timeline t = overlap(chunks, &st.spans);
    // Then, in order: what is issued after backward, the optimizer step, offload's transfers and host AdamW.
    double at = t.seconds;
    for (const auto& [name, seconds, communication] : {std::tuple{"collectives after backward", exposed_phases, true},
                                                       {"optimizer step", optimizer, false},
                                                       {"offload: PCIe and host AdamW", st.offload, false}}) {
      if (seconds > 0) st.spans.push_back({name, communication, at, at + seconds});
      at += seconds;
    }
    st.compute = t.compute + optimizer;
    st.exposed_communication = t.exposed() + exposed_phases;
    st.seconds = t.seconds + exposed_phases + optimizer + st.offload;
    tokens = m * static_cast<double>(full.tokens()) / tensor;
    st.model_flops = model::step_flops(full) * m / tensor;
  }
  const double peak =
      (model_options.compute == DType::kF32 ? setting.hardware.fp32_tflops : setting.hardware.bf16_dense_tflops) * 1e12;
  st.tokens_per_second_per_gpu = st.seconds > 0 ? tokens / st.seconds : 0;
  st.mfu = st.seconds > 0 ? st.model_flops / (st.seconds * peak) : 0;
  return st;
}

StepTime predict_step_time(const RunReport& report, const StrategyOutcome& outcome, const StepTimeSetting& setting) {
  return predict_step_time(report.options, report.world, outcome, setting, report.scale());
}

StepTimeSetting step_time_setting(const RunOptions& options) {
  StepTimeSetting setting;
  if (options.hardware.empty()) return setting;
  setting.hardware = find_hardware(options.hardware);
  setting.achievable = parse_achievable(options.achievable, achievable_for(setting.hardware));
  // A node is what --gpus-per-node says, else the node size the strategies grouped by when the user declared one
  // (--ranks-per-node, else EMU_COLL_RANKS_PER_NODE, as run.cpp reads them), else the hardware's. The ranks MPI
  // finds on this host do not count: they say how the emulation was launched, not the machines it predicts.
  const int declared = coll::CommunicatorOptions::from_environment().ranks_per_node;
  setting.gpus_per_node = options.gpus_per_node > 0    ? options.gpus_per_node
                          : options.ranks_per_node > 0 ? options.ranks_per_node
                          : declared > 0               ? declared
                                                       : setting.hardware.gpus_per_node;
  return setting;
}

void record_phase_traffic(StrategyOutcome& outcome, const coll::Communicator& group, double steps) {
  if (group.name() == "control") return;
  for (const auto& [key, entry] : group.ledger().entries()) {
    const auto& [kind, phase] = key;
    if (starts_with(phase, "report:") || phase == "out-of-memory agreement") continue;
    const bool p2p = kind == coll::CollectiveKind::kSend || kind == coll::CollectiveKind::kRecv;
    outcome.phase_traffic.push_back({kind, group_kind(group.name()), group.size(),
                                     p2p ? std::string() : std::string(group.algorithm(kind).name), phase,
                                     static_cast<double>(entry.calls) / steps,
                                     static_cast<uint64_t>(std::llround(static_cast<double>(entry.payload) / steps))});
  }
}

std::string format_step_times(const RunReport& report) {
  if (report.options.hardware.empty()) return "";
  const StepTimeSetting setting = step_time_setting(report.options);
  const Hardware& hw = setting.hardware;
  const int nodes = (report.world + setting.gpus_per_node - 1) / setting.gpus_per_node;
  std::string out = fmt::format(
      "\npredicted step on {} x {} ({}; {} GPUs per node, {} node{}): bf16 {} TFLOP/s, HBM {} GB/s, {} {} GB/s, "
      "{} {} GB/s per GPU\n  achievable: {}\n",
      report.world, hw.name, hw.origin, setting.gpus_per_node, nodes, nodes == 1 ? "" : "s", hw.bf16_dense_tflops,
      hw.hbm_gb_per_s, hw.intra_node.link, hw.intra_node.gb_per_s_per_direction, hw.inter_node.link,
      hw.inter_node.gb_per_s_per_direction, setting.achievable.basis);
  out += fmt::format("{:<14} {:<12} {:>9} | {:>9} {:>9} {:>9} {:>9} {:>9} | {:>10} {:>6}\n", "step time", "verdict",
                     "step s", "compute", "exposed", "comm", "bubble", "offload", "tokens/s", "MFU");
  for (const StrategyOutcome& o : report.outcomes) {
    const StepTime st = predict_step_time(report, o, setting);
    out += fmt::format("{:<14} {:<12} {:>9.4f} | {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} | {:>10.0f} {:>5.1f}%\n",
                       o.name, o.fits() ? "fits" : "OOM", st.seconds, st.compute, st.exposed_communication,
                       st.communication, st.bubble, st.offload, st.tokens_per_second_per_gpu, 100 * st.mfu);
  }
  out +=
      "  seconds per optimizer step at full scale: compute (roofline per op, recomputation and optimizer included), "
      "exposed\n  communication (not hidden by compute), comm (every collective, hidden or not), pp's bubble, "
      "offload (PCIe + CPU Adam);\n  tokens/s per GPU and MFU (model FLOPs, 6 per parameter per token + attention, "
      "over the dense peak).\n";
  return out;
}

}  // namespace emu::app
