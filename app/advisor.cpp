#include "app/advisor.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <thread>

#include "app/plan.h"
#include "app/step_time.h"
#include "emu/check.h"
#include "emu/units.h"
#include "workloads/model/shrink.h"

namespace emu::app {
namespace {

// The flags the advisor sets itself: taken out of the user's command line before each suggestion's own are added.
// Those that take a value, and those that do not.
// The run's output files (--json, --trace, --svg, --save-weights) are the asked run's, not the suggestion's.
const std::set<std::string_view> kOwnedWithValue = {
    "--strategies",      "--micro-batch", "--grad-accum", "--precision", "--seq-len",      "--find-limit",
    "--advise-max-gpus", "--json",        "--trace",      "--svg",       "--save-weights", "--recompute"};
const std::set<std::string_view> kOwnedFlags = {"--checkpoint", "--no-checkpoint", "--offload",       "--offload-param",
                                                "--advise",     "--no-advise",     "--advise-seq-len"};
constexpr int kShown = 5;        // suggestions shown, before the best on each GPU count not among them
constexpr int kSeqHalvings = 3;  // --advise-seq-len: the sequence halved at most this often

bool is_number(std::string_view text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
}

// The user's arguments without the flags the advisor sets (--flag value, --flag=value, --plan [N], --expect ...).
std::vector<std::string> kept_arguments(const std::vector<std::string>& arguments) {
  std::vector<std::string> kept;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& arg = arguments[i];
    const std::string name = arg.substr(0, arg.find('='));
    const bool inline_value = name.size() != arg.size();
    if (kOwnedFlags.contains(name)) continue;
    if (kOwnedWithValue.contains(name)) {
      if (!inline_value) ++i;
      continue;
    }
    if (name == "--plan") {  // an optional value
      if (!inline_value && i + 1 < arguments.size() && is_number(arguments[i + 1])) ++i;
      continue;
    }
    if (name == "--expect") {  // a verdict about strategies the suggestion may not run; any number of values
      while (!inline_value && i + 1 < arguments.size() && !arguments[i + 1].starts_with("-")) ++i;
      continue;
    }
    kept.push_back(arg);
  }
  return kept;
}

// `text` as a POSIX shell reads it back: bare when it has no special characters, else single-quoted.
std::string shell_quote(const std::string& text) {
  const bool plain = !text.empty() && text.find_first_not_of(
                                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789_-+=/.,:@%") == std::string::npos;
  if (plain) return text;
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// What the search varies, and the flags that set it on top of the user's kept arguments.
struct Knobs {
  std::string strategy;
  int gpus = 1;
  int64_t micro_batch = 1;
  int accumulation = 1;
  bool checkpoint = true;
  int offload = 0;  // 0 none, 1 optimizer, 2 optimizer and ZeRO-3 parameters
  std::string precision;
  int64_t seq = 0;
};

std::vector<std::string> knob_flags(const Knobs& knobs, const AdviceConfig& asked, bool deepspeed) {
  std::vector<std::string> flags = {"--strategies", knobs.strategy};
  // Given when not the flag's default, or changed from what was asked; a DeepSpeed config may set micro-batch,
  // accumulation and precision itself, so with one they are always given.
  if (knobs.micro_batch != 1 || knobs.micro_batch != asked.micro_batch || deepspeed) {
    flags.insert(flags.end(), {"--micro-batch", std::to_string(knobs.micro_batch)});
  }
  if (knobs.accumulation != 1 || knobs.accumulation != asked.accumulation || deepspeed) {
    flags.insert(flags.end(), {"--grad-accum", std::to_string(knobs.accumulation)});
  }
  if (knobs.precision != "mixed" || knobs.precision != asked.precision || deepspeed) {
    flags.insert(flags.end(), {"--precision", knobs.precision});
  }
  if (knobs.seq != asked.seq) flags.insert(flags.end(), {"--seq-len", std::to_string(knobs.seq)});
  if (!knobs.checkpoint) flags.emplace_back("--no-checkpoint");
  if (knobs.offload >= 1) flags.emplace_back("--offload");
  if (knobs.offload >= 2) flags.emplace_back("--offload-param");
  return flags;
}

// The flags of `config` that differ from `asked`, in words a user types.
std::vector<std::string> changes(const AdviceConfig& config, const AdviceConfig& asked) {
  std::vector<std::string> out;
  if (config.micro_batch != asked.micro_batch) out.push_back(fmt::format("--micro-batch {}", config.micro_batch));
  if (config.accumulation != asked.accumulation) out.push_back(fmt::format("--grad-accum {}", config.accumulation));
  if (config.precision != asked.precision) out.push_back("--precision " + config.precision);
  if (config.seq != asked.seq) out.push_back(fmt::format("--seq-len {}", config.seq));
  if (config.checkpoint != asked.checkpoint) out.emplace_back(config.checkpoint ? "--checkpoint" : "--no-checkpoint");
  if (config.offload != asked.offload) out.emplace_back(config.offload ? "--offload" : "no --offload");
  if (config.offload_param != asked.offload_param) {
    out.emplace_back(config.offload_param ? "--offload-param" : "no --offload-param");
  }
  return out;
}

// What the parse of a command line made of it: the knobs as emu will run them.
AdviceConfig read_back(const RunOptions& parsed, int gpus) {
  const strategy::StrategyOptions& first = parsed.strategies.front();
  AdviceConfig config;
  config.strategy = first.name();
  config.gpus = gpus;
  config.micro_batch = parsed.full.batch;
  config.accumulation = parsed.accumulation;
  config.checkpoint = parsed.model_options.checkpoint;
  config.offload = parsed.offload;
  config.offload_param = first.kind == strategy::StrategyKind::kZero3 && first.zero.offload_param;
  config.precision = std::string(first.recipe.name());
  config.seq = parsed.full.seq;
  return config;
}

// `fit` makes `candidate` not worth planning: the same strategy, and no knob of `fit` costs more.
bool dominates(const AdviceConfig& fit, const AdviceConfig& candidate, const AdviceConfig& asked) {
  return fit.strategy == candidate.strategy && fit.gpus <= candidate.gpus &&
         fit.offload_level() <= candidate.offload_level() && (!fit.checkpoint || candidate.checkpoint) &&
         fit.micro_batch >= candidate.micro_batch &&
         (fit.precision == asked.precision || fit.precision == candidate.precision) &&
         (fit.seq == asked.seq || fit.seq >= candidate.seq);
}

// The GPU counts searched: the ranks asked, doubled up to the limit, and the limit itself.
std::vector<int> gpu_counts(int asked, int most) {
  std::vector<int> counts;
  for (int64_t n = asked; n <= most; n *= 2) counts.push_back(static_cast<int>(n));
  if (counts.back() != most) counts.push_back(most);
  return counts;
}

// Micro-batch and accumulation for `gpus` GPUs: b × a = the sequences per GPU that keep the asked global batch
// (when `gpus` divides it; else one sequence per GPU, and the global batch grows), largest micro-batch first.
std::vector<std::pair<int64_t, int>> batch_splits(int64_t global, int gpus) {
  const int64_t per_gpu = global % gpus == 0 ? global / gpus : 1;
  std::vector<std::pair<int64_t, int>> splits;
  for (int64_t b = per_gpu; b >= 1; --b) {
    if (per_gpu % b == 0 && per_gpu / b <= 4096) splits.emplace_back(b, static_cast<int>(per_gpu / b));
  }
  return splits;
}

std::vector<std::string> strategies_searched(const RunOptions& options) {
  std::vector<std::string> names;
  for (const std::string& name : strategy::strategy_names()) {
    // HYBRID_SHARD on one node is FULL_SHARD: searched when the user says how many ranks a node has.
    if (name == "fsdp-hybrid" && options.ranks_per_node == 0) continue;
    names.push_back(name);
  }
  return names;
}

// The asked recipe first; pure bf16 AdamW (8 B/param) is the one recipe smaller than mixed and fp32, and fp32 is
// offered mixed's bf16 activations too.
std::vector<std::string> precisions_searched(const std::string& asked) {
  std::vector<std::string> out = {asked};
  if (asked != "bf16") out.emplace_back("bf16");
  if (asked == "fp32") out.emplace_back("mixed");
  return out;
}

class Search {
 public:
  Search(const RunOptions& options, int world, int ranks_per_node)
      : options_(options), world_(world), ranks_per_node_(ranks_per_node), kept_(kept_arguments(options.arguments)) {
    asked_ = read_back(options, options.plan && options.plan_ranks > 0 ? options.plan_ranks : world);
    asked_.strategy = options.strategies.front().name();
    cap_ = options.cap.bytes;
    setting_ = advice_setting(options);
  }

  const std::string& hardware() const { return setting_.hardware.name; }

  const AdviceConfig& asked() const { return asked_; }

  // Plans `knobs` through its own command line and keeps it when it fits; counts it refused when emu refuses the
  // command line.
  void evaluate(const Knobs& knobs, Advice& advice) {
    std::vector<std::string> arguments = kept_;
    const std::vector<std::string> flags = knob_flags(knobs, asked_, !options_.deepspeed.empty());
    arguments.insert(arguments.end(), flags.begin(), flags.end());
    std::vector<std::string> evaluated = arguments;
    evaluated.insert(evaluated.end(), {"--plan", std::to_string(knobs.gpus)});
    std::vector<const char*> argv = {options_.program.c_str()};
    for (const std::string& arg : evaluated) argv.push_back(arg.c_str());
    ParsedCommandLine parsed;
    try {
      parsed = parse_command_line(static_cast<int>(argv.size()), argv.data(), knobs.gpus);
    } catch (const InputError&) {
      ++advice.not_applicable;
      return;
    }
    const AdviceConfig config = read_back(parsed.options, knobs.gpus);
    if (!tried_.insert(config).second) return;  // the same configuration by another route (a DeepSpeed default)
    for (const Suggestion& fit : fits_) {
      if (dominates(fit.config, config, asked_)) {
        ++advice.dominated;
        return;
      }
    }
    ++advice.searched;
    const RunOptions& run = parsed.options;
    StrategyOutcome first;
    const std::optional<uint64_t> peak =
        planned_fit(run, run.strategies.front(), run.full, knobs.gpus, ranks_per_node_, &first);
    if (!peak) return;
    Suggestion suggestion;
    if (!setting_.hardware.name.empty()) {
      const StepTime predicted = predict_step_time(run, knobs.gpus, first, setting_);
      suggestion.step_seconds = predicted.seconds;
      suggestion.tokens_per_second_per_gpu = predicted.tokens_per_second_per_gpu;
    }
    suggestion.config = config;
    suggestion.peak = *peak;
    suggestion.cap = cap_;
    suggestion.changes = changes(config, asked_);
    // A run is offered only where the shrunk run it makes (k = its own default or --shrink) fits too: its rounding
    // of F, V and s can tip a configuration with little headroom over the cap.
    suggestion.plan_form =
        runs_as_plan(knobs.gpus) ||
        !planned_fit(run, run.strategies.front(), model::shrink(run.full, run.shrink), knobs.gpus, ranks_per_node_);
    suggestion.command = command(arguments, knobs.gpus, suggestion.plan_form);
    fits_.push_back(std::move(suggestion));
  }

  // Dominated configurations are skipped before they are planned: a knob whose cost is already paid by a fit is
  // never worth showing.
  bool dominated(const Knobs& knobs) const {
    AdviceConfig config;
    config.strategy = knobs.strategy;
    config.gpus = knobs.gpus;
    config.micro_batch = knobs.micro_batch;
    config.checkpoint = knobs.checkpoint;
    config.offload = knobs.offload >= 1;
    config.offload_param = knobs.offload >= 2;
    config.precision = knobs.precision;
    config.seq = knobs.seq;
    return std::any_of(fits_.begin(), fits_.end(),
                       [&](const Suggestion& fit) { return dominates(fit.config, config, asked_); });
  }

  std::vector<Suggestion>& fits() { return fits_; }

 private:
  // A run at `gpus` ranks when this job already runs that many or the host has the hardware threads; a plan when
  // the question was a plan or the ranks are more than this machine runs.
  bool runs_as_plan(int gpus) const {
    if (options_.plan) return true;
    const int threads = static_cast<int>(std::thread::hardware_concurrency());
    return gpus > std::max(world_, threads);
  }

  std::string command(const std::vector<std::string>& arguments, int gpus, bool plan_form) const {
    std::string out = plan_form ? shell_quote(options_.program)
                                : fmt::format("mpirun -np {} {}", gpus, shell_quote(options_.program));
    for (const std::string& arg : arguments) {
      out += ' ';  // appended apart: GCC 12 warns (-Wrestrict, a false positive) on " " + a temporary
      out += shell_quote(arg);
    }
    if (plan_form) out += fmt::format(" --plan {}", gpus);
    return out;
  }

  // The hardware the suggestions are timed on: --hardware, else the cap's named GPU as its SXM description
  // (a100-40gb → a100-40gb-sxm), else none (then the knobs' cost order ranks them).
  static StepTimeSetting advice_setting(const RunOptions& options) {
    RunOptions timed = options;
    if (timed.hardware.empty() && !options.cap.gpu.empty()) {
      const std::string sxm = options.cap.gpu + "-sxm";
      if (hardware_names().find(sxm) != std::string::npos) timed.hardware = sxm;
    }
    return step_time_setting(timed);
  }

  const RunOptions& options_;
  const int world_;
  const int ranks_per_node_;
  const std::vector<std::string> kept_;
  AdviceConfig asked_;
  uint64_t cap_ = 0;
  StepTimeSetting setting_;
  std::set<AdviceConfig> tried_;
  std::vector<Suggestion> fits_;
};

// The configurations of `strategy` on `gpus` GPUs, cheapest knobs first: the asked sequence and precision, the
// largest micro-batch, no checkpointing, no offload.
std::vector<Knobs> knobs_of(const std::string& strategy, int gpus, const std::vector<int64_t>& seqs,
                            const std::vector<std::string>& precisions, const AdviceConfig& asked) {
  // DeepSpeed offloads only with ZeRO: zero0 has no offload (options.cpp refuses it).
  const int most_offload = strategy == "zero3" ? 2 : strategy == "zero0" ? 0 : 1;
  std::vector<Knobs> out;
  for (const int64_t seq : seqs) {
    for (const std::string& precision : precisions) {
      // tp's GPUs share each micro-batch: all of the global batch goes through each of them.
      for (const auto& [micro_batch, accumulation] : batch_splits(asked.global_batch(), strategy == "tp" ? 1 : gpus)) {
        for (const bool checkpoint : {false, true}) {
          for (int offload = 0; offload <= most_offload; ++offload) {
            out.push_back({strategy, gpus, micro_batch, accumulation, checkpoint, offload, precision, seq});
          }
        }
      }
    }
  }
  return out;
}

// Best first (advice_rank_key); the first kShown, then the best on each GPU count not among them.
std::vector<Suggestion> choose_shown(std::vector<Suggestion> fits, const AdviceConfig& asked) {
  std::stable_sort(fits.begin(), fits.end(), [&](const Suggestion& a, const Suggestion& b) {
    return advice_rank_key(a, asked) < advice_rank_key(b, asked);
  });
  std::vector<Suggestion> shown;
  std::set<int> counts;
  for (const Suggestion& s : fits) {
    if (static_cast<int>(shown.size()) >= kShown) break;
    shown.push_back(s);
    counts.insert(s.config.gpus);
  }
  for (const Suggestion& s : fits) {
    if (counts.insert(s.config.gpus).second) shown.push_back(s);
  }
  return shown;
}

std::string gib(uint64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / kGiB); }

// "zero3 + --offload" or "on 8 GPUs with fsdp + --precision bf16".
std::string in_words(const Suggestion& s, const AdviceConfig& asked) {
  std::string words = s.config.gpus == asked.gpus ? "with " : fmt::format("on {} GPUs with ", s.config.gpus);
  words += s.config.strategy;
  for (const std::string& change : s.changes) words += " + " + change;
  return words;
}

}  // namespace

AdviceRankKey advice_rank_key(const Suggestion& s, const AdviceConfig& asked) {
  const AdviceConfig& c = s.config;
  return {c.seq == asked.seq ? 0 : 1,
          c.gpus,
          s.seconds_per_sequence(),
          c.offload_level(),
          c.checkpoint ? 1 : 0,
          -c.micro_batch,
          c.precision == asked.precision ? 0 : 1,
          -static_cast<int64_t>(s.headroom())};
}

bool should_advise(const RunReport& report) {
  const RunOptions& options = report.options;
  if (options.no_advise || !options.find_limit.empty() || !report.complete || options.cap.unlimited) return false;
  if (options.advise) return true;
  return std::none_of(report.outcomes.begin(), report.outcomes.end(),
                      [](const StrategyOutcome& outcome) { return outcome.fits(); });
}

Advice advise(const RunReport& report, int world, int ranks_per_node) {
  const RunOptions& options = report.options;
  EMU_CHECK(!options.cap.unlimited, "the advisor needs a cap to fit under");
  const auto start = std::chrono::steady_clock::now();
  Search search(options, world, ranks_per_node);
  const AdviceConfig& asked = search.asked();
  Advice advice;
  advice.model = options.full.name;
  advice.gpu_words = options.cap.gpu.empty()
                         ? fmt::format("{} GPUs with a {} cap", asked.gpus, format_bytes(options.cap.bytes))
                         : fmt::format("{} x {}", asked.gpus, options.cap.gpu);
  advice.asked = asked;
  advice.gpu_counts = gpu_counts(asked.gpus, options.advise_max_gpus);
  advice.seq_len_searched = options.advise_seq_len;
  std::vector<int64_t> seqs = {asked.seq};
  for (int i = 0; options.advise_seq_len && i < kSeqHalvings && seqs.back() / 2 >= 1; ++i) {
    seqs.push_back(seqs.back() / 2);
  }
  // Cheapest knobs first within each strategy, so that a fit prunes the configurations that only cost more.
  for (const std::string& strategy : strategies_searched(options)) {
    for (const int gpus : advice.gpu_counts) {
      for (const Knobs& knobs : knobs_of(strategy, gpus, seqs, precisions_searched(asked.precision), asked)) {
        if (search.dominated(knobs)) {
          ++advice.dominated;
          continue;
        }
        search.evaluate(knobs, advice);
      }
    }
  }
  advice.fits = static_cast<int>(search.fits().size());
  advice.asked_fits = std::any_of(report.outcomes.begin(), report.outcomes.end(),
                                  [](const StrategyOutcome& outcome) { return outcome.fits(); });
  advice.hardware = search.hardware();
  advice.suggestions = choose_shown(search.fits(), asked);
  advice.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return advice;
}

std::string format_advice(const Advice& a) {
  std::string out = fmt::format("\nadvice: {} on {}: ", a.model, a.gpu_words);
  out += a.asked_fits ? "fits as asked" : "does not fit as asked";
  if (a.suggestions.empty()) {
    out += fmt::format("; no configuration searched fits (up to {} GPUs; --advise-max-gpus to search more)\n",
                       a.gpu_counts.back());
  } else {
    std::vector<std::string> each;
    for (const Suggestion& s : a.suggestions) {
      each.push_back(fmt::format("{} ({} GiB, {} GiB headroom{})", in_words(s, a.asked), gib(s.peak), gib(s.headroom()),
                                 s.step_seconds > 0 ? fmt::format(", ~{:.2f} s/step", s.step_seconds) : ""));
    }
    out += fmt::format("; {} {}.\n", a.asked_fits ? "also fits" : "fits", fmt::join(each, ", or "));
  }
  out += fmt::format(
      "  searched {} configurations in {:.1f} s (shapes-only plans at full scale; {} skipped as costlier than a fit "
      "of the same strategy, {} refused by emu's checks): every strategy, {} GPUs, micro-batch x accumulation "
      "keeping the global batch {}, checkpointing, offload, precision{}\n",
      a.searched, a.seconds, a.dominated, a.not_applicable, fmt::join(a.gpu_counts, ", "), a.asked.global_batch(),
      a.seq_len_searched ? ", sequence length" : "");
  out += a.hardware.empty()
             ? std::string(
                   "  ranked by a cost order of the knobs (fewer GPUs; no offload; no checkpointing; larger "
                   "micro-batch; the asked precision; more headroom): no hardware to time them on "
                   "(--hardware)\n")
             : fmt::format(
                   "  ranked by GPUs, then the predicted time per sequence of the global batch on {} (the "
                   "step-time model; --hardware to choose another)\n",
                   a.hardware);
  if (a.suggestions.empty()) return out;
  out += fmt::format("  {:>2} {:>5}  {:<14} {:>9} {:>9} {:>8} {:>10}  {}\n", "#", "GPUs", "strategy", "peak GiB",
                     "headroom", "s/step", "tok/s/GPU", "changes");
  for (size_t i = 0; i < a.suggestions.size(); ++i) {
    const Suggestion& s = a.suggestions[i];
    const bool timed = s.step_seconds > 0;
    out += fmt::format("  {:>2} {:>5}  {:<14} {:>9} {:>9} {:>8} {:>10}  {}\n", i + 1, s.config.gpus, s.config.strategy,
                       gib(s.peak), gib(s.headroom()), timed ? fmt::format("{:.2f}", s.step_seconds) : "-",
                       timed ? fmt::format("{:.0f}", s.tokens_per_second_per_gpu) : "-",
                       s.changes.empty() ? std::string("as asked") : fmt::format("{}", fmt::join(s.changes, " ")));
    out += fmt::format("     $ {}\n", s.command);
  }
  return out;
}

nlohmann::json advice_json(const Advice& a) {
  const auto config = [](const AdviceConfig& c) {
    return nlohmann::json{{"strategy", c.strategy},           {"gpus", c.gpus},
                          {"micro_batch", c.micro_batch},     {"gradient_accumulation", c.accumulation},
                          {"global_batch", c.global_batch()}, {"activation_checkpointing", c.checkpoint},
                          {"optimizer_offload", c.offload},   {"parameter_offload", c.offload_param},
                          {"precision", c.precision},         {"seq_len", c.seq}};
  };
  nlohmann::json suggestions = nlohmann::json::array();
  for (const Suggestion& s : a.suggestions) {
    suggestions.push_back({{"config", config(s.config)},
                           {"peak_bytes", s.peak},
                           {"cap_bytes", s.cap},
                           {"headroom_bytes", s.headroom()},
                           {"changes", s.changes},
                           {"form", s.plan_form ? "plan" : "run"},
                           {"command", s.command},
                           {"predicted_step_seconds", s.step_seconds > 0 ? nlohmann::json(s.step_seconds) : nullptr},
                           {"predicted_tokens_per_second_per_gpu",
                            s.step_seconds > 0 ? nlohmann::json(s.tokens_per_second_per_gpu) : nullptr}});
  }
  return {{"asked", config(a.asked)},
          {"fits_as_asked", a.asked_fits},
          {"gpu_counts", a.gpu_counts},
          {"searched", a.searched},
          {"dominated", a.dominated},
          {"not_applicable", a.not_applicable},
          {"fits", a.fits},
          {"seconds", a.seconds},
          {"ranked_by", a.hardware.empty() ? std::string("cost order of the knobs")
                                           : "predicted time per sequence on " + a.hardware},
          {"suggestions", suggestions}};
}

}  // namespace emu::app
