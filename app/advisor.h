// The advisor: when a configuration does not fit (or on --advise), search the knobs a user actually has —
// strategy, GPU count, micro-batch with gradient accumulation keeping the global batch, activation checkpointing,
// optimizer and ZeRO-3 parameter offload, precision recipe, and the sequence length when --advise-seq-len allows —
// with shapes-only plans at full scale (plan.h, the path `--plan N` takes), and print the few best configurations
// that fit, each with its peak, its headroom and the command line that runs it.
//
// Every configuration is evaluated by parsing the command line the advice prints (with `--plan N` added) and
// planning what that parse yields, so a suggestion's figures are those of its own command line.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "app/run.h"

namespace emu::app {

// The knobs of one configuration, as its parsed command line has them.
struct AdviceConfig {
  std::string strategy;
  int gpus = 1;
  int64_t micro_batch = 1;
  int accumulation = 1;
  bool checkpoint = true;
  bool offload = false;        // --offload: the optimizer state in host memory
  bool offload_param = false;  // --offload-param: ZeRO-3's parameter partitions in host memory
  std::string precision = "mixed";
  int64_t seq = 0;
  int offload_level() const { return offload_param ? 2 : offload ? 1 : 0; }
  // Sequences per optimizer step: every GPU's own micro-batches, but for tp, whose GPUs share each micro-batch.
  int64_t global_batch() const {
    return static_cast<int64_t>(strategy == "tp" ? 1 : gpus) * micro_batch * accumulation;
  }
  auto operator<=>(const AdviceConfig&) const = default;
};

struct Suggestion {
  AdviceConfig config;
  uint64_t peak = 0;  // bytes per GPU at full scale: the highest role's reserved peak (what the cap is checked against)
  uint64_t cap = 0;
  uint64_t headroom() const { return cap > peak ? cap - peak : 0; }
  std::vector<std::string> changes;  // the flags that differ from the configuration asked ("--offload")
  bool plan_form = false;            // the command is `emu --plan N ...`, not `mpirun -np N emu ...`
  std::string command;               // as the user would type it
  // The step-time model's prediction on the advice's hardware (step_time.h); 0 when no hardware is known.
  double step_seconds = 0;
  double tokens_per_second_per_gpu = 0;
  // Seconds per sequence of the global batch: what ranks configurations whose global batches differ.
  double seconds_per_sequence() const {
    return step_seconds / static_cast<double>(std::max<int64_t>(1, config.global_batch()));
  }
};

// The order suggestions are shown in, lowest first: the asked sequence length before a shorter one, fewer GPUs (the
// GPUs asked for first), then the predicted time per sequence of the global batch on the advice's hardware (when
// one is known: --hardware, or the cap's named GPU as its SXM description), then a cost order of the knobs (no
// offload before optimizer offload before parameter offload, no checkpointing before checkpointing, a larger
// micro-batch, the asked precision before another) and the most headroom.
using AdviceRankKey = std::tuple<int, int, double, int, int, int64_t, int, int64_t>;
AdviceRankKey advice_rank_key(const Suggestion& suggestion, const AdviceConfig& asked);

struct Advice {
  std::string model;
  std::string gpu_words;                // "4 x a100-40gb" or "8 GPUs with a 37.25 GiB cap"
  AdviceConfig asked;                   // the knobs asked (strategy: the first one asked)
  bool asked_fits = false;              // some strategy asked fits
  std::vector<Suggestion> suggestions;  // shown, best first
  int searched = 0;                     // configurations planned
  int dominated = 0;                    // not planned: a cheaper one of the same strategy fits
  int not_applicable = 0;               // refused by emu's own checks (pp with more ranks than blocks, ...)
  int fits = 0;                         // of those planned
  std::vector<int> gpu_counts;
  bool seq_len_searched = false;  // --advise-seq-len
  std::string hardware;           // the step-time model's hardware ranking the suggestions; empty: none known
  double seconds = 0;
};

// Whether rank 0 advises after `report`: --advise, or nothing fit, unless --no-advise (never for --find-limit).
bool should_advise(const RunReport& report);

// Rank 0 only: the search after `report` (its options, and whether any strategy fit). `world` and
// `ranks_per_node`: the job's, as the run or plan had them.
Advice advise(const RunReport& report, int world, int ranks_per_node);

std::string format_advice(const Advice& advice);
nlohmann::json advice_json(const Advice& advice);

}  // namespace emu::app
