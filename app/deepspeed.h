// A DeepSpeed JSON config, run as it is: zero_optimization (stage and its bucket, prefetch, persistence and
// offload settings), bf16 / fp16, micro-batch, gradient accumulation, clipping, the AdamW hyper-parameters and a
// WarmupLR schedule. "auto" (as the Hugging Face Trainer writes) keeps emu's default. Keys emu does not model are
// listed so that nothing is ignored silently.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "strategies/strategy.h"

namespace emu::app {

struct DeepSpeedConfig {
  std::string strategy;             // "zero0" (stage 0: DeepSpeed without ZeRO), "zero1", "zero2" or "zero3"
  strategy::StrategyOptions knobs;  // recipe, bucket sizes, prefetch, persistence, clipping, AdamW, warm-up
  int micro_batch = 0;              // 0: not given
  int accumulation = 0;             // 0: not given
  int train_batch_size = 0;         // 0: not given; must equal micro_batch · accumulation · ranks
  bool precision_auto = false;      // bf16/fp16 "enabled": "auto" and neither true: the recipe stays emu's
  bool offload_optimizer = false;
  bool has_optimizer = false;          // an "optimizer" section: DeepSpeed builds it (no client optimizer)
  std::vector<std::string> ignored;    // keys present that emu does not model
  std::vector<std::string> applied;    // "zero_optimization.stage 2": every key that set a setting, as written
  std::vector<std::string> left_auto;  // keys written "auto": emu's default or the command line's value stands
};

// Applies the file's settings over `defaults`. InputError naming the file, the key and the bad value (or the JSON
// error's byte position).
DeepSpeedConfig parse_deepspeed_config(std::string_view text, std::string_view source,
                                       const strategy::StrategyOptions& defaults);
DeepSpeedConfig load_deepspeed_config(const std::filesystem::path& path, const strategy::StrategyOptions& defaults);

// The Hugging Face Trainer's fill of zero_optimization keys left "auto", from the model's hidden size h at full scale
// (transformers integrations/deepspeed.py, trainer_config_finalize): reduce_bucket_size h², and at stage 3
// stage3_prefetch_bucket_size ⌊0.9·h²⌋ and stage3_param_persistence_threshold 10·h. Each key it fills in
// `left_auto` reads "key = value (the Trainer's, from h)".
void fill_auto_from_hidden(strategy::ZeroOptions& zero, bool stage3, int64_t hidden,
                           std::vector<std::string>& left_auto);
// WarmupDecayLR's total_num_steps left "auto": the Trainer's max_steps, which is the run's `steps`; `left_auto`
// reads "key = steps (...)".
void fill_auto_total_steps(optim::LrSchedule& schedule, int steps, std::vector<std::string>& left_auto);

// DeepSpeed's batch arithmetic (runtime/config.py, _set_batch_related_parameters): train_batch_size = micro-batch ×
// gradient_accumulation_steps × data-parallel ranks; any two of the three give the third (one alone: accumulation
// 1), and all three must agree. `micro_batch`/`accumulation` are 0 when not given and are filled in. InputError
// naming the file and the arithmetic when they cannot agree.
void derive_batch(int train_batch_size, int ranks, int& micro_batch, int& accumulation, std::string_view source);

}  // namespace emu::app
