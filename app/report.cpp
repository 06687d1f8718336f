#include "app/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "app/header.h"
#include "app/plan.h"
#include "app/step_time.h"
#include "emu/units.h"
#include "strategies/pipeline.h"
#include "workloads/model/layout.h"
#include "workloads/model/shrink.h"

namespace emu::app {
namespace {

// Full-scale bytes as GiB with two decimals: the unit PyTorch prints GPU memory in.
std::string gib(double bytes) { return fmt::format("{:.2f}", bytes / static_cast<double>(kGiB)); }
std::string gb(double bytes) { return fmt::format("{:.2f}", bytes / 1e9); }

// Ranks each entry of the outcome's per-rank figures stands for: 1 in a run, a role's ranks in a plan.
int ranks_of(const StrategyOutcome& o, size_t index) { return o.roles.empty() ? 1 : o.roles[index].ranks(); }

std::string verdict_text(const RunReport& r, const StrategyOutcome& o) {
  if (o.fits()) return "fits";
  int failing = 0;
  for (size_t i = 0; i < o.verdict.ranks.size(); ++i) failing += o.verdict.ranks[i].out_of_memory ? ranks_of(o, i) : 0;
  return failing == r.world ? "OOM (all)" : fmt::format("OOM ({} of {})", failing, r.world);
}

// Full-scale bytes first; in a shrunk run, what the run itself charged in brackets.
std::string both_units(const RunReport& r, uint64_t bytes) {
  if (r.scale() == 1) return format_bytes(bytes);
  return fmt::format("{} [{}]", format_bytes(bytes * r.scale()), format_bytes(bytes));
}

// What the recipe keeps per parameter, as the strategy's framework keeps it (strategy::with_framework_recipe):
// PyTorch DDP's mixed recipe is torch.autocast over fp32 weights, DeepSpeed's and FSDP's a 2-byte copy beside fp32
// master weights.
std::string recipe_words(const optim::PrecisionRecipe& recipe) {
  switch (recipe.recipe) {
    case optim::Recipe::kMixed:
      if (recipe.params == DType::kF32) {
        return "mixed precision by autocast (16 bytes per parameter: fp32 weights, gradients and Adam moments, "
               "bf16 compute)";
      }
      if (recipe.grads == DType::kF32) {  // Megatron-LM's (tp): fp32 main gradients beside the 2-byte weights
        return fmt::format(
            "mixed-precision AdamW (18 bytes per parameter: {} weights, fp32 main gradients, fp32 master weights and "
            "Adam moments)",
            recipe.half_name());
      }
      return fmt::format(
          "mixed-precision AdamW (16 bytes per parameter: {} weights and gradients, fp32 master weights and "
          "Adam moments)",
          recipe.half_name());
    case optim::Recipe::kPureBf16: return "pure-bf16 AdamW (8 bytes per parameter)";
    case optim::Recipe::kFp32: return "fp32 AdamW (16 bytes per parameter)";
  }
  return "";
}

std::string cap_words(const RunReport& r) {
  const CapSpec& cap = r.options.cap;
  if (cap.unlimited) return "GPUs without a cap";
  if (!cap.gpu.empty()) return fmt::format("{} ({} GiB usable)", cap.gpu, gib(static_cast<double>(cap.bytes)));
  std::string stated = cap.text;
  if (cap.scaled) stated.resize(stated.size() - std::string_view("-scaled").size());
  return fmt::format("{} GPUs ({} GiB each)", stated, gib(static_cast<double>(r.cap) * static_cast<double>(r.scale())));
}

// Allocated beside reserved, for the rank whose reserved memory peaked highest: a GPU runs out of the latter.
std::string format_reserved(const RunReport& r) {
  if (r.options.allocator != AllocatorKind::kCaching) return "";
  const double scale = static_cast<double>(r.scale());
  const std::string conf = r.options.alloc_conf.str();
  std::string out =
      fmt::format("{:<14} {:>10} {:>10} {:>10} {:>10}   allocator: PyTorch's caching allocator{}\n", "reserved/rank",
                  "allocated", "reserved", "fragment.", "peak rank", conf.empty() ? "" : fmt::format(" ({})", conf));
  for (const StrategyOutcome& o : r.outcomes) {
    if (o.reserved_peak.empty()) continue;
    const auto p = static_cast<size_t>(o.reserved_peak_rank);
    const uint64_t reserved = o.reserved_peak[p];
    const uint64_t allocated = o.allocated_at_reserved_peak[p];
    out += fmt::format("{:<14} {:>10} {:>10} {:>10} {:>10}\n", o.name,
                       gib(static_cast<double>(o.peak[static_cast<size_t>(o.peak_rank)]) * scale),
                       gib(static_cast<double>(reserved) * scale),
                       gib(static_cast<double>(reserved - allocated) * scale), o.reserved_peak_rank);
  }
  out +=
      "  GiB at full scale. allocated: the peak in use, as above; reserved: the peak held by the caching allocator's "
      "segments plus the reserve,\n  what the cap is checked against (as a GPU runs out); fragment.: reserved - "
      "allocated at the reserved peak.\n\n";
  return out;
}

// The predicted model states of the rank that peaked (a pipeline's stages hold different layers); rank 0's where
// the outcome has no per-rank predictions.
uint64_t predicted_states_at_peak(const StrategyOutcome& o) {
  return o.predicted_states.empty() ? o.prediction.model_state_bytes() : o.predicted_states[o.peak_rank];
}

}  // namespace

std::string oom_summary(const RunReport& r, const StrategyOutcome& o) {
  std::vector<std::string> failing;
  int count = 0;
  const strategy::RankMemory* first = nullptr;
  size_t first_index = 0;
  for (size_t i = 0; i < o.verdict.ranks.size(); ++i) {
    const strategy::RankMemory& m = o.verdict.ranks[i];
    if (!m.out_of_memory) continue;
    failing.push_back(r.rank_words(o, i));
    count += ranks_of(o, i);
    if (first == nullptr) {
      first = &m;
      first_index = i;
    }
  }
  if (first == nullptr) return fmt::format("all {} ranks fit", r.world);
  const uint64_t over = first->peak > first->cap ? first->peak - first->cap : 0;
  // A plan: "any of the 64 ranks runs out of memory, first in ..."; a run: "ranks 1, 3 of 4 ran out of memory;
  // rank 1 first in ...".
  std::string who;
  if (!o.roles.empty() && failing.size() == 1) {
    who = fmt::format("{} runs out of memory,", failing.front());
  } else if (!o.roles.empty()) {
    who =
        fmt::format("{} of {} run out of memory; {}", fmt::join(failing, ", "), r.world, r.rank_words(o, first_index));
  } else if (count == r.world && count > 1) {
    who = fmt::format("all {} ranks ran out of memory; rank {}", r.world, first->rank);
  } else {
    std::vector<int> numbers;
    for (const strategy::RankMemory& m : o.verdict.ranks) {
      if (m.out_of_memory) numbers.push_back(m.rank);
    }
    who = fmt::format("rank{} {} of {} ran out of memory; rank {}", count == 1 ? "" : "s", fmt::join(numbers, ", "),
                      r.world, first->rank);
  }
  return fmt::format(
      "{} first in {} (tried to allocate {} for {} with {} in use of a {} cap), needing {} at its "
      "peak, {} more than its cap",
      who, first->phase.empty() ? "an unnamed phase" : first->phase, both_units(r, first->requested),
      first->what.empty() ? "an unnamed tensor" : first->what, both_units(r, first->in_use), both_units(r, first->cap),
      both_units(r, first->peak), both_units(r, over));
}

std::string format_report(const RunReport& r) {
  const double scale = static_cast<double>(r.scale());
  const model::ModelConfig& m = r.model;
  const int steps = reported_steps(r.options);
  std::string out;
  out += fmt::format(
      "\n{} on {} rank{}{}: h {}, F {}, V {}, s {}, L {}, a {}, kv {}, b {}; {} parameters{}; {} optimizer step{}{}\n",
      m.name, r.world, r.world == 1 ? "" : "s", r.plan ? " (shapes only, full scale)" : "", m.hidden, m.ffn, m.vocab,
      m.seq, m.layers, m.heads, m.kv_heads, m.batch, model::parameter_count(m),
      r.plan ? ""
             : fmt::format(" (x k^2 = {:.3g} at full scale)", static_cast<double>(model::parameter_count(m)) * scale),
      steps, steps == 1 ? "" : "s",
      r.options.accumulation > 1 ? fmt::format(", {} accumulated micro-batches each", r.options.accumulation) : "");
  out += fmt::format(
      "cap per rank {}{}; figures in GiB at full scale{}\n\n", r.cap == kNoCap ? "none" : format_bytes(r.cap),
      r.cap == kNoCap || r.plan ? "" : fmt::format(" = {} GiB at full scale", gib(static_cast<double>(r.cap) * scale)),
      r.plan ? "" : fmt::format(" (measured bytes x {}^2)", r.shrink));

  // Memory at the peak of the rank that peaked highest.
  out += fmt::format("{:<14} {:<12} {:>9} {:>12} | {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} | {:>9} {:>9}\n",
                     "memory/rank", "verdict", "peak GiB", r.plan ? "" : "[shrunk run]", "params", "grads", "master",
                     "optim", "activ", "temp", "comm", "buckets", "states", "predicted");
  for (const StrategyOutcome& o : r.outcomes) {
    if (o.peak.empty()) continue;
    const CategoryBytes& at = o.at_peak[o.peak_rank];
    const CategoryBytes& own = o.category_peaks[o.peak_rank];
    const double states = static_cast<double>(own[Category::kParameters] + own[Category::kGradients] +
                                              own[Category::kMasterWeights] + own[Category::kOptimizerState]);
    const auto g = [&](Category c) { return gib(static_cast<double>(at[c]) * scale); };
    out += fmt::format("{:<14} {:<12} {:>9} {:>12} | {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} | {:>9} {:>9}\n",
                       o.name, verdict_text(r, o), gib(static_cast<double>(o.peak[o.peak_rank]) * scale),
                       r.plan ? "" : fmt::format("[{}]", format_bytes(o.peak[o.peak_rank])), g(Category::kParameters),
                       g(Category::kGradients), g(Category::kMasterWeights), g(Category::kOptimizerState),
                       g(Category::kActivations), g(Category::kTemporaries), g(Category::kCommBuffers),
                       g(Category::kBuckets), gib(states * scale),
                       gib(static_cast<double>(predicted_states_at_peak(o)) * scale));
  }
  out += fmt::format(
      "  peak: the highest rank's peak in use at full scale{}; the columns after it are what was in use at that "
      "moment, reserve aside.\n  states: parameters + gradients + master + optimizer at their own peaks; predicted: "
      "the analytic model's for the same rank (ZeRO paper + buffers).\n\n",
      r.plan ? "" : ", the shrunk run's own bytes in brackets");
  out += format_reserved(r);

  // Traffic per optimizer step of one rank; a reduce column only where some strategy reduces to a root (DeepSpeed's
  // use_multi_rank_bucket_allreduce false), so the usual table keeps its shape.
  const auto sent_by = [](const StrategyOutcome& o, coll::CollectiveKind kind) {
    double bytes = 0;
    for (const auto& [key, t] : o.traffic_per_step) bytes += key.kind == kind ? static_cast<double>(t.sent) : 0.0;
    return bytes;
  };
  const bool reduces = std::any_of(r.outcomes.begin(), r.outcomes.end(), [&](const StrategyOutcome& o) {
    return sent_by(o, coll::CollectiveKind::kReduce) > 0;
  });
  out += fmt::format("{:<14} {:>11} {:>14} {:>11}{} {:>11} {:>11} {:>9} | {:>9} {:>9}\n", "traffic/rank", "all-reduce",
                     "reduce-scatter", "all-gather", reduces ? fmt::format(" {:>11}", "reduce") : "", "total GB",
                     "predicted", "PCIe GB", "step s", "loss");
  for (const StrategyOutcome& o : r.outcomes) {
    const auto sent = [&](coll::CollectiveKind kind) { return sent_by(o, kind); };
    double total = 0;
    for (const auto& [kind, t] : o.traffic_per_step) total += static_cast<double>(t.sent);
    double predicted = 0;
    for (const auto& t : o.prediction.traffic) predicted += static_cast<double>(t.sent);
    const double pcie = static_cast<double>(o.host_per_step.device_to_host + o.host_per_step.host_to_device);
    const double seconds = o.step_seconds.empty() ? 0
                                                  : std::accumulate(o.step_seconds.begin(), o.step_seconds.end(), 0.0) /
                                                        static_cast<double>(o.step_seconds.size());
    out += fmt::format(
        "{:<14} {:>11} {:>14} {:>11}{} {:>11} {:>11} {:>9} | {:>9} {:>9}\n", o.name,
        gb(sent(coll::CollectiveKind::kAllReduce) * scale), gb(sent(coll::CollectiveKind::kReduceScatter) * scale),
        gb(sent(coll::CollectiveKind::kAllGather) * scale),
        reduces ? fmt::format(" {:>11}", gb(sent(coll::CollectiveKind::kReduce) * scale)) : "", gb(total * scale),
        gb(predicted * scale), gb(pcie * scale), r.plan ? "-" : fmt::format("{:.3f}", seconds),
        o.losses.empty() || r.plan ? "-" : fmt::format("{:.4f}", o.losses.back()));
  }
  out +=
      "  bytes each rank sends per optimizer step, in GB (10^9) at full scale; predicted: ring volumes "
      "2(N-1)/N and (N-1)/N of each payload.\n  step s: wall time of the emulation on this machine, not a GPU's.\n";
  for (const StrategyOutcome& o : r.outcomes) {
    if (!o.fits()) out += fmt::format("  {}: {}\n", o.name, oom_summary(r, o));
  }
  out += format_step_times(r);
  out += format_pipeline(r);
  out += format_tensor(r);
  return out;
}

namespace {

// Interleaved 1F1B's schedule line: Megatron's warm-up of 2(P - s - 1) + (V - 1)P forwards, so stage s holds
// min(2(P-s-1) + (V-1)P + 1, VM) chunk micro-batches, each 1/V of its blocks: the first stage P + (P-1)/V
// micro-batches' activations of its blocks (Korthikanti et al. 2022, §4.2.3: 1 + (P-1)/(PV) times 1F1B's P), and the
// bubble (P-1)/(VM) of the ideal step (Narayanan et al. 2021, §2.2.2).
std::string interleaved_words(const std::string& name, int stages, int chunks, int micro_batches, int64_t batch,
                              int64_t layers) {
  const int first = std::min(2 * (stages - 1) + (chunks - 1) * stages + 1, chunks * micro_batches);
  return fmt::format(
      "\n{}: interleaved 1F1B, V = {} chunks of L/(PV) = {} blocks per stage (chunk v of stage p: layer group v*P+p) "
      "over {} stages, M = {} micro-batches of {}: bubble (P-1)/(VM+P-1) = {}/{} = {:.1f}% of a step idle, (P-1)/(VM) "
      "= {:.1f}% of the ideal step\n  in flight: stage s holds min(2(P-s-1)+(V-1)P+1, VM) chunk micro-batches, stage 0 "
      "{} = {:.2f} micro-batches' activations of its blocks (1F1B: {})\n",
      name, chunks, layers / (stages * chunks), stages, micro_batches, batch, stages - 1,
      chunks * micro_batches + stages - 1, 100.0 * strategy::bubble_fraction(stages, micro_batches, chunks),
      100.0 * (stages - 1) / (chunks * micro_batches), first, static_cast<double>(first) / chunks,
      std::min(stages, micro_batches));
}

// The schedule line of a pipeline: its bubble and, interleaved, what each stage holds.
std::string schedule_words(const std::string& name, const strategy::PipelineOptions& pipeline, int stages,
                           int micro_batches, int64_t batch, int64_t layers) {
  if (pipeline.virtual_stages > 1) {
    return interleaved_words(name, stages, pipeline.virtual_stages, micro_batches, batch, layers);
  }
  const bool gpipe = pipeline.schedule == strategy::Schedule::kGpipe;
  return fmt::format(
      "\n{}: {} over {} stages, M = {} micro-batches of {}: bubble (P-1)/(M+P-1) = {}/{} = {:.1f}% of a step idle\n",
      name, gpipe ? "GPipe (all forwards, then all backwards)" : "1F1B (stage s holds at most P-s micro-batches)",
      stages, micro_batches, batch, stages - 1, micro_batches + stages - 1,
      100.0 * strategy::bubble_fraction(stages, micro_batches));
}

// The tensor-parallel group's line of a pipeline whose stages are TP `tensor` (rank 0 sending `sent` bytes per
// step): all-reduces, or under sequence parallelism reduce-scatters and all-gathers and a b·s/T send.
std::string tensor_stage_words(int tensor, double sent, bool sequence, bool checkpoint) {
  if (!sequence) {
    return fmt::format(
        "  tensor-parallel group (T = {}, each stage's blocks split as tp splits them): rank 0 sends {} GB per step, "
        "4 all-reduces of b*s*h per block per micro-batch, ring 2(T-1)/T; each TP rank sends the whole b*s*h to the "
        "next stage (Megatron-core's p2p, no scatter-gather)\n",
        tensor, gb(sent));
  }
  return fmt::format(
      "  tensor-parallel group (T = {}, each stage's blocks split as tp splits them, sequence parallel): rank 0 "
      "sends {} GB per step, {} reduce-scatters and {} all-gathers of b*s*h per block per micro-batch{}, ring "
      "(T-1)/T each, and the stage's norm gradients all-reduced once per step; each TP rank sends its b*s/T rows "
      "to the same TP rank of the next stage (Megatron's p2p with --sequence-parallel)\n",
      tensor, gb(sent), checkpoint ? 6 : 4, checkpoint ? 8 : 6,
      checkpoint ? " (checkpointed: the forward's again in backward)" : "");
}

// A pipeline's data-parallel group line: FSDP2's shard group of each stage, or Megatron's replicas of it; nothing
// without replicas.
std::string data_group_words(const StrategyOutcome& o, const strategy::Mesh& mesh, const std::string& sent_gb) {
  if (mesh.data <= 1) return "";
  if (o.options.kind == strategy::StrategyKind::kFsdp2) {
    return fmt::format(
        "  data-parallel group (D = {}, FSDP2's shard group of each stage): rank 0 sends {} GB per step, each unit "
        "all-gathered once (reshard_after_forward=False) and its gradients, summed over the M micro-batches, "
        "reduce-scattered once after {}, ring (D-1)/D each\n",
        mesh.data, sent_gb,
        o.options.pipeline.virtual_stages > 1 ? "its chunk's last backward (each chunk an FSDP module)"
                                              : "the last backward");
  }
  return fmt::format(
      "  data-parallel group (D = {}): rank 0 sends {} GB per step {} (Megatron-LM's DistributedDataParallel)\n",
      mesh.data, sent_gb,
      o.options.parallel.distributed_optimizer
          ? "reduce-scattering its stage's gradients and all-gathering its parameters (distributed optimizer: "
            "optimizer state 1/D), ring (D-1)/D each"
          : "all-reducing its stage's gradients, ring 2(D-1)/D");
}

}  // namespace

std::string format_pipeline(const RunReport& r) {
  std::string out;
  const double scale = static_cast<double>(r.scale());
  const int micro_batches = pipeline_micro_batches(r.options, r.world);
  for (const StrategyOutcome& o : r.outcomes) {
    if (!strategy::pipelined(o.options) || o.peak.empty()) continue;
    const strategy::Mesh mesh = strategy::mesh_of(o.options, r.world, 0);
    const int stages = mesh.pipeline;
    const int chunks = o.options.pipeline.virtual_stages;
    out += schedule_words(o.name, o.options.pipeline, stages, micro_batches, r.model.batch, r.model.layers);
    std::vector<std::string> peaks;
    for (size_t i = 0; i < o.peak.size(); ++i) {
      peaks.push_back(fmt::format("{} {}", o.roles.empty() ? fmt::format("{}", i) : r.rank_words(o, i),
                                  gib(static_cast<double>(o.peak[i]) * scale)));
    }
    std::string layout;
    if (mesh.tensor > 1) layout += fmt::format(" / {} (its TP ranks)", mesh.tensor);
    if (mesh.data > 1) layout += fmt::format(" mod {}, {} data-parallel pipelines", stages, mesh.data);
    out += fmt::format("  peak GiB per stage (stage = rank{}): {}; highest: {}\n", layout, fmt::join(peaks, ", "),
                       o.roles.empty() ? fmt::format("rank {}", o.peak_rank) : r.rank_words(o, o.peak_rank));
    double sent = 0, data_sent = 0, tensor_sent = 0;
    for (const auto& [key, t] : o.traffic_per_step) {
      sent += key.kind == coll::CollectiveKind::kSend ? static_cast<double>(t.sent) : 0.0;
      if (key.group == "data-parallel") data_sent += static_cast<double>(t.sent);
      if (key.group == "tensor-parallel") tensor_sent += static_cast<double>(t.sent);
    }
    const bool sequence = mesh.tensor > 1 && r.options.model_options.sequence_parallel;
    out += fmt::format(
        "  send/recv: rank 0 sends {} GB per step; the pipeline moves b*s*h{}*bytes per micro-batch per boundary each "
        "way, {} = {} messages\n",
        gb(sent * scale), sequence ? "/T" : "", chunks > 1 ? "2(PV-1)M" : "2(P-1)M",
        2 * (stages * chunks - 1) * micro_batches);
    if (mesh.tensor > 1) {
      out += tensor_stage_words(mesh.tensor, tensor_sent * scale, sequence, r.options.model_options.checkpoint);
    }
    out += data_group_words(o, mesh, gb(data_sent * scale));
  }
  return out;
}

std::string format_conclusion(const RunReport& r) {
  std::vector<std::string> fit, oom;
  const double scale = static_cast<double>(r.scale());
  const StrategyOutcome* cheapest = nullptr;
  double cheapest_bytes = 0;
  for (const StrategyOutcome& o : r.outcomes) {
    if (o.peak.empty()) continue;
    // What the device had to hold: the caching allocator's reserved peak (the allocated peak when exact).
    const double needed = static_cast<double>(o.reserved_peak[o.reserved_peak_rank]) * scale;
    if (o.fits()) {
      fit.push_back(fmt::format("{} ({} GiB peak)", o.name, gib(needed)));
      double sent = 0;
      for (const auto& [kind, t] : o.traffic_per_step) sent += static_cast<double>(t.sent);
      if (cheapest == nullptr || sent < cheapest_bytes) {
        cheapest = &o;
        cheapest_bytes = sent;
      }
    } else {
      oom.push_back(fmt::format("{} (needs {} GiB per GPU)", o.name, gib(needed)));
    }
  }
  // One recipe for every strategy: named once; else each recipe with the strategies that keep it.
  std::vector<std::pair<std::string, std::vector<std::string>>> recipes;
  for (const StrategyOutcome& o : r.outcomes) {
    const std::string words = recipe_words(strategy::with_framework_recipe(o.options).recipe);
    auto same = std::find_if(recipes.begin(), recipes.end(), [&](const auto& entry) { return entry.first == words; });
    if (same == recipes.end()) {
      recipes.push_back({words, {o.name}});
    } else {
      same->second.push_back(o.name);
    }
  }
  std::string setting = fmt::format("On {} x {} a {} full fine-tune", r.world, cap_words(r), r.options.full.name);
  std::string kept;
  if (recipes.size() == 1) {
    setting += " with " + recipes.front().first;
  } else {
    std::vector<std::string> each;
    each.reserve(recipes.size());
    for (const auto& [words, names] : recipes) each.push_back(fmt::format("{} with {}", fmt::join(names, ", "), words));
    kept = fmt::format("Each strategy keeps its framework's recipe: {}.\n", fmt::join(each, "; "));
  }
  std::string out = "\n";
  if (oom.empty()) {
    out += fmt::format("{} fits with every strategy tried: {}.\n", setting, fmt::join(fit, ", "));
  } else if (fit.empty()) {
    out += fmt::format("{} fits with none of the strategies tried: {}.\n", setting, fmt::join(oom, ", "));
  } else {
    out += fmt::format("{} fits only with {}; it runs out of memory with {}.\n", setting, fmt::join(fit, ", "),
                       fmt::join(oom, ", "));
  }
  out += kept;
  if (cheapest != nullptr && r.world > 1) {
    out += fmt::format("Of those that fit, {} moves the fewest bytes: {} GB per GPU per step.\n", cheapest->name,
                       gb(cheapest_bytes * scale));
  }
  if (!r.plan) {
    out += fmt::format(
        "Figures are the shrunk run's bytes x {}^2 (k = {}{}); `--plan {}` accounts the full-scale "
        "shapes directly and agrees up to the rounding of F, V and s: at most {:+.3f}% on a memory term.\n",
        r.shrink, r.shrink, r.options.shrink_chosen ? ", chosen for speed; --shrink to change" : "", r.world,
        100 * run_shrink_report(r.options, r.shrink).worst_memory_term().deviation(r.shrink));
  }
  return out;
}

}  // namespace emu::app
