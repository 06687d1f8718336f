#include "app/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "emu/units.h"
#include "workloads/model/layout.h"
#include "workloads/model/shrink.h"

namespace emu::app {
namespace {

// Full-scale bytes as GiB with two decimals: the unit PyTorch prints GPU memory in.
std::string gib(double bytes) { return fmt::format("{:.2f}", bytes / static_cast<double>(kGiB)); }
std::string gb(double bytes) { return fmt::format("{:.2f}", bytes / 1e9); }

std::string verdict_text(const StrategyOutcome& o) {
  if (o.fits()) return "fits";
  const auto failing = o.verdict.failing_ranks();
  return failing.size() == o.verdict.ranks.size()
             ? "OOM (all)"
             : fmt::format("OOM ({} of {})", failing.size(), o.verdict.ranks.size());
}

std::string recipe_words(const optim::PrecisionRecipe& recipe) {
  switch (recipe.recipe) {
    case optim::Recipe::kMixed:
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

}  // namespace

std::string format_report(const RunReport& r) {
  const double scale = static_cast<double>(r.scale());
  const model::ModelConfig& m = r.model;
  std::string out;
  out += fmt::format(
      "\n{} on {} rank{}{}: h {}, F {}, V {}, s {}, L {}, a {}, kv {}, b {}; {} parameters{}; {} step{} each{}\n",
      m.name, r.world, r.world == 1 ? "" : "s", r.plan ? " (shapes only, full scale)" : "", m.hidden, m.ffn, m.vocab,
      m.seq, m.layers, m.heads, m.kv_heads, m.batch, model::parameter_count(m),
      r.plan ? ""
             : fmt::format(" (x k^2 = {:.3g} at full scale)", static_cast<double>(model::parameter_count(m)) * scale),
      r.options.steps, r.options.steps == 1 ? "" : "s",
      r.options.accumulation > 1 ? fmt::format(" of {} micro-batches", r.options.accumulation) : "");
  out += fmt::format(
      "cap per rank {}{}; figures in GiB at full scale{}\n\n", r.cap == kNoCap ? "none" : format_bytes(r.cap),
      r.cap == kNoCap || r.plan ? "" : fmt::format(" = {} GiB at full scale", gib(static_cast<double>(r.cap) * scale)),
      r.plan ? "" : fmt::format(" (measured bytes x {}^2)", r.shrink));

  // Memory at the peak of the rank that peaked highest.
  out += fmt::format("{:<14} {:<12} {:>10} {:>9} | {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} | {:>9} {:>9}\n",
                     "memory/rank", "verdict", "peak", "peak GiB", "params", "grads", "master", "optim", "activ",
                     "temp", "comm", "buckets", "states", "predicted");
  for (const StrategyOutcome& o : r.outcomes) {
    if (o.peak.empty()) continue;
    const CategoryBytes& at = o.at_peak[o.peak_rank];
    const CategoryBytes& own = o.category_peaks[o.peak_rank];
    const double states = static_cast<double>(own[Category::kParameters] + own[Category::kGradients] +
                                              own[Category::kMasterWeights] + own[Category::kOptimizerState]);
    const auto g = [&](Category c) { return gib(static_cast<double>(at[c]) * scale); };
    out += fmt::format(
        "{:<14} {:<12} {:>10} {:>9} | {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} | {:>9} {:>9}\n", o.name,
        verdict_text(o), format_bytes(o.peak[o.peak_rank]), gib(static_cast<double>(o.peak[o.peak_rank]) * scale),
        g(Category::kParameters), g(Category::kGradients), g(Category::kMasterWeights), g(Category::kOptimizerState),
        g(Category::kActivations), g(Category::kTemporaries), g(Category::kCommBuffers), g(Category::kBuckets),
        gib(states * scale), gib(static_cast<double>(o.prediction.model_state_bytes()) * scale));
  }
  out +=
      "  peak: the highest rank's peak in use; the columns after it are what was in use at that moment, reserve "
      "aside.\n  states: parameters + gradients + master + optimizer at their own peaks; predicted: the "
      "analytic model (ZeRO paper + buffers).\n\n";
  out += format_reserved(r);

  // Traffic per optimizer step of one rank.
  out += fmt::format("{:<14} {:>11} {:>14} {:>11} {:>11} {:>11} {:>9} | {:>9} {:>9}\n", "traffic/rank", "all-reduce",
                     "reduce-scatter", "all-gather", "total GB", "predicted", "PCIe GB", "step s", "loss");
  for (const StrategyOutcome& o : r.outcomes) {
    const auto sent = [&](coll::CollectiveKind kind) {
      const auto it = o.traffic_per_step.find(kind);
      return it == o.traffic_per_step.end() ? 0.0 : static_cast<double>(it->second.sent);
    };
    double total = 0;
    for (const auto& [kind, t] : o.traffic_per_step) total += static_cast<double>(t.sent);
    double predicted = 0;
    for (const auto& t : o.prediction.traffic) predicted += static_cast<double>(t.sent);
    const double pcie = static_cast<double>(o.host_per_step.device_to_host + o.host_per_step.host_to_device);
    const double seconds = o.step_seconds.empty() ? 0
                                                  : std::accumulate(o.step_seconds.begin(), o.step_seconds.end(), 0.0) /
                                                        static_cast<double>(o.step_seconds.size());
    out += fmt::format("{:<14} {:>11} {:>14} {:>11} {:>11} {:>11} {:>9} | {:>9} {:>9}\n", o.name,
                       gb(sent(coll::CollectiveKind::kAllReduce) * scale),
                       gb(sent(coll::CollectiveKind::kReduceScatter) * scale),
                       gb(sent(coll::CollectiveKind::kAllGather) * scale), gb(total * scale), gb(predicted * scale),
                       gb(pcie * scale), r.plan ? "-" : fmt::format("{:.3f}", seconds),
                       o.losses.empty() || r.plan ? "-" : fmt::format("{:.4f}", o.losses.back()));
  }
  out +=
      "  bytes each rank sends per optimizer step, in GB (10^9) at full scale; predicted: ring volumes "
      "2(N-1)/N and (N-1)/N of each payload.\n  step s: wall time of the emulation on this machine, not a GPU's.\n";
  for (const StrategyOutcome& o : r.outcomes) {
    if (o.fits()) continue;
    if (r.plan) {
      // A plan's rank 0 stands for every rank: they hold equal shards.
      const strategy::RankMemory& first = o.verdict.ranks.front();
      out += fmt::format(
          "  {}: every rank runs out of memory, first in {} (tried to allocate {} for {} with {} in use), "
          "needing {} at its peak\n",
          o.name, first.phase, format_bytes(first.requested), first.what, format_bytes(first.in_use),
          format_bytes(first.peak));
    } else {
      out += fmt::format("  {}: {}\n", o.name, o.verdict.summary());
    }
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
  const std::string setting = fmt::format("On {} x {} a {} full fine-tune with {}", r.world, cap_words(r),
                                          r.options.full.name, recipe_words(r.options.strategies.front().recipe));
  std::string out = "\n";
  if (oom.empty()) {
    out += fmt::format("{} fits with every strategy tried: {}.\n", setting, fmt::join(fit, ", "));
  } else if (fit.empty()) {
    out += fmt::format("{} fits with none of the strategies tried: {}.\n", setting, fmt::join(oom, ", "));
  } else {
    out += fmt::format("{} fits only with {}; it runs out of memory with {}.\n", setting, fmt::join(fit, ", "),
                       fmt::join(oom, ", "));
  }
  if (cheapest != nullptr && r.world > 1) {
    out += fmt::format("Of those that fit, {} moves the fewest bytes: {} GB per GPU per step.\n", cheapest->name,
                       gb(cheapest_bytes * scale));
  }
  if (!r.plan) {
    out += fmt::format(
        "Figures are the shrunk run's bytes x {}^2 (k = {}{}); `--plan {}` accounts the full-scale "
        "shapes directly and agrees up to the rounding of F, V and s: at most {:+.3f}% on a memory term.\n",
        r.shrink, r.shrink, r.options.shrink_chosen ? ", chosen for speed; --shrink to change" : "", r.world,
        100 * model::shrink_report(r.options.full, r.shrink, r.options.model_options)
                  .worst_memory_term()
                  .deviation(r.shrink));
  }
  return out;
}

}  // namespace emu::app
