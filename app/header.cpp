#include "app/header.h"

#include <cblas.h>
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "app/plan.h"
#include "emu/check.h"
#include "emu/cpu/blas_info.h"
#include "emu/device.h"
#include "emu/topology.h"
#include "emu/units.h"
#include "strategies/strategy.h"
#include "workloads/model/shrink.h"

namespace emu::app {
namespace {

// Gathers one short string per rank on rank 0 (empty elsewhere).
std::vector<std::string> gather_strings(const std::string& mine, int rank, int world) {
  constexpr int kWidth = 128;
  std::vector<char> send(kWidth, '\0');
  mine.copy(send.data(), kWidth - 1);
  std::vector<char> all(rank == 0 ? static_cast<size_t>(kWidth) * world : 0);
  EMU_MPI_CHECK(MPI_Gather(send.data(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, 0, MPI_COMM_WORLD));
  std::vector<std::string> out;
  for (int r = 0; rank == 0 && r < world; ++r) out.emplace_back(all.data() + static_cast<size_t>(r) * kWidth);
  return out;
}

std::string strategy_list(const RunOptions& options) {
  std::vector<std::string> names;
  for (const strategy::StrategyOptions& o : options.strategies) names.push_back(o.name());
  return fmt::format("{}", fmt::join(names, ", "));
}

// "  model     llama2-13b (llama), micro-batch 1, seq-len 4096, sdpa attention, ...": the model as it runs.
std::string model_line(const RunOptions& options) {
  const std::string seq_note =
      options.full.seq_default.empty() ? "" : fmt::format(" (default: {})", options.full.seq_default);
  const std::string source = options.full.name == options.model ? "" : fmt::format(", from {}", options.model);
  return fmt::format(
      "  model     {} ({}{}), micro-batch {}, seq-len {}{}, {} attention, {} loss, activation checkpointing {}{}{}\n",
      options.full.name, model::family_name(options.full), source, options.full.batch, options.full.seq, seq_note,
      model::attention_name(options.model_options.attention), model::loss_name(options.model_options.loss),
      options.model_options.checkpoint ? "on" : "off",
      options.model_options.selective_recompute ? " (selective recomputation of the attention core)" : "",
      options.model_options.sequence_parallel ? ", tp sequence parallel" : "");
}

// " (DeepSpeed WarmupLR, log from 1e-08 over 1000 steps)", " (linear warm-up over 100 steps)" or nothing.
std::string warmup_words(const optim::LrSchedule& schedule) {
  if (schedule.warmup != optim::LrSchedule::Warmup::kLinear) {
    const bool decay = schedule.decay == optim::LrSchedule::Decay::kDeepSpeedLinear;
    return fmt::format(
        " (DeepSpeed {}, {} from {} over {} steps{})", decay ? "WarmupDecayLR" : "WarmupLR",
        schedule.warmup == optim::LrSchedule::Warmup::kDeepSpeedLog ? "log" : "linear", schedule.warmup_min_lr,
        std::max<int64_t>(2, schedule.warmup_steps),
        decay ? fmt::format(", then linear to {} at step {}", schedule.warmup_min_lr, schedule.total_steps + 2) : "");
  }
  return schedule.warmup_steps > 0 ? fmt::format(" (linear warm-up over {} steps)", schedule.warmup_steps) : "";
}

// ", optimizer offloaded to the host", ", ZeRO-3 parameters offloaded to the host", both, or nothing.
std::string offload_words(const RunOptions& options) {
  std::string words = options.offload ? ", optimizer offloaded to the host" : "";
  if (options.strategies.front().zero.offload_param) words += ", ZeRO-3 parameters offloaded to the host";
  return words;
}

// "  training  mixed precision, AdamW (foreach) lr 0.001, clip 1, 3 optimizer steps, 1 micro-batch per rank per
// step ...": counts of steps and micro-batches, never to be read as sizes.
std::string training_line(const RunOptions& options) {
  const strategy::StrategyOptions& first = options.strategies.front();
  const int steps = reported_steps(options);
  return fmt::format(
      "  training  {} precision{}, AdamW ({}) lr {}{}, clip {}, {} optimizer step{}, {} micro-batch{} per rank per "
      "step{}{}\n",
      first.recipe.name(), first.recipe.fp16 ? " (fp16 as the config says, computed in bf16)" : "",
      optim::adamw_impl_name(first.adamw_impl), first.adamw.lr, warmup_words(first.schedule), first.clip_norm, steps,
      steps == 1 ? "" : "s", options.accumulation, options.accumulation == 1 ? "" : "es (gradient accumulation)",
      offload_words(options), options.deepspeed.empty() ? "" : ", DeepSpeed config " + options.deepspeed);
}

// Where the settings came from when a DeepSpeed config gave them: what it set, what it left "auto" and what the
// command line overrode. Empty without a config.
std::string settings_lines(const RunOptions& options) {
  if (options.deepspeed.empty()) return "";
  std::string text =
      fmt::format("  config    {} sets {}\n", options.deepspeed,
                  options.deepspeed_sets.empty() ? "nothing emu models"
                                                 : fmt::format("{}", fmt::join(options.deepspeed_sets, ", ")));
  if (!options.deepspeed_auto.empty()) {
    text += fmt::format("            \"auto\" (emu's default or the command line's): {}\n",
                        fmt::join(options.deepspeed_auto, ", "));
  }
  if (!options.overridden.empty()) {
    text += fmt::format("            the command line overrides: {}\n", fmt::join(options.overridden, "; "));
  }
  return text;
}

// The BLAS line: the library and the kernels it runs, and when they leave this CPU's vector units unused, how to
// choose others (emu/cpu/blas_info.h).
std::string blas_line(const cpu::BlasInfo& blas) {
  std::string line = fmt::format("  blas      {}", blas.config);
  if (!blas.coretype.empty()) line += fmt::format(" (OPENBLAS_CORETYPE={})", blas.coretype);
  if (!blas.suggestion.empty()) {
    line += fmt::format(
        "\n            {}'s kernels use SSE only and this CPU has {}: this OpenBLAS does not know the CPU's model and "
        "fell back to them. OPENBLAS_CORETYPE={} in every rank's environment runs its {} kernels instead",
        blas.core, blas.unused_units, blas.suggestion, blas.suggestion);
  }
  return line + "\n";
}

}  // namespace

model::ShrinkReport run_shrink_report(const RunOptions& options, int64_t k) {
  bool autocast = false, plain = false;
  for (const strategy::StrategyOptions& o : options.strategies) {
    (strategy::framework_model_options(o, options.model_options).autocast ? autocast : plain) = true;
  }
  model::ModelOptions under_autocast = options.model_options;
  under_autocast.autocast = true;
  model::ShrinkReport report =
      model::shrink_report(options.full, k, autocast && !plain ? under_autocast : options.model_options);
  if (!autocast || !plain) return report;
  const model::ShrinkReport other = model::shrink_report(options.full, k, under_autocast);
  std::vector<model::ShrinkTerm> terms;
  for (size_t i = 0; i < report.terms.size(); ++i) {
    terms.push_back(report.terms[i]);
    const model::ShrinkTerm& t = other.terms[i];
    if (t.full == report.terms[i].full && t.shrunk == report.terms[i].shrunk) continue;
    terms.push_back(t);
    terms.back().name = "  under ddp's autocast";
  }
  report.terms = std::move(terms);
  return report;
}

void print_run_header(const MpiSession& mpi, const RunOptions& options) {
  const HostInfo host = describe_host();
  const Binding binding = bind_to_core(mpi.local_rank(), mpi.local_size());
  // Ranks sharing cores each run OpenBLAS on one thread; more would only take turns on the same cores.
  if (binding.oversubscribed || mpi.local_size() > 1) openblas_set_num_threads(1);
  const std::vector<std::string> placements =
      gather_strings(fmt::format("{} {}", host.hostname, binding.detail), mpi.rank(), mpi.world());
  if (mpi.rank() != 0) return;

  const int k = options.shrink;
  const uint64_t k2 = static_cast<uint64_t>(k) * k;
  const uint64_t reserve = options.reserve_full_scale / k2;
  std::string text = fmt::format("emu {}: {} rank{} on {} host{}, one emulated GPU per rank\n", EMU_VERSION,
                                 mpi.world(), mpi.world() == 1 ? "" : "s", mpi.hosts(), mpi.hosts() == 1 ? "" : "s");
  text += fmt::format("  host      {}\n", host.summary());
  if (!options.plan) text += blas_line(cpu::describe_blas());  // a plan does no math
  text += model_line(options);
  text += training_line(options);
  text += settings_lines(options);
  text += fmt::format("  strategies {}\n", strategy_list(options));
  if (!options.plan && !options.tokens_path.empty()) {
    text += fmt::format(
        "  data      token file {} ({}-bit ids{})\n", options.tokens_path, options.token_bits,
        k > 1 ? fmt::format(", folded into the shrunk vocabulary: id mod {}", model::shrink(options.full, k).vocab)
              : "");
  }
  if (!options.plan && !options.load_weights_path.empty()) {
    text += fmt::format("  weights   loaded from {}\n", options.load_weights_path);
  }
  if (!options.plan && !options.save_weights_path.empty()) {
    // One file: the first strategy's weights (every strategy trains the same numbers).
    text += fmt::format("  saving    {}'s weights {} to {} (the first strategy's; the others' are the same numbers)\n",
                        options.strategies.front().name(),
                        options.steps == 0 ? "as initialised (--steps 0)" : "after its last step",
                        options.save_weights_path);
  }
  if (options.plan) {
    const model::ShrinkReport shrunk = run_shrink_report(options, k);
    text += fmt::format(
        "  plan      shapes only at full scale for {} ranks: no data, no math; a run shrunk by k = {} charges "
        "these figures / k^2 up to the rounding of F, V and s ({:+.3f}% at most on a memory term)\n",
        options.plan_ranks > 0 ? options.plan_ranks : mpi.world(), k, 100 * shrunk.worst_memory_term().deviation(k));
  } else {
    text += fmt::format(
        "  shrink    k = {}{}: memory terms / k^2 = / {}\n", k,
        options.shrink_chosen
            ? fmt::format(" (the smallest k leaving at most {}M parameters and {} GFLOP per micro-batch step; --shrink "
                          "to choose)",
                          model::kDefaultShrinkParams / 1'000'000, model::kDefaultShrinkFlops / 1e9)
            : "",
        k2);
  }
  if (options.plan) {
    text += fmt::format("  cap       {} per GPU, as stated: a plan is at full scale\n",
                        options.cap.unlimited ? "none" : format_bytes(options.cap.bytes));
  } else {
    text += fmt::format("  cap       {}\n", options.cap.describe(k));
    // A named GPU unscaled on a shrunk model stands for k^2 such GPUs: almost always a missing "-scaled".
    if (!options.cap.gpu.empty() && !options.cap.scaled && k > 1) {
      text += fmt::format("            note: one {} per shrunk rank; --cap {}-scaled stands for the GPU itself\n",
                          options.cap.gpu, options.cap.text);
    }
  }
  text += options.plan ? fmt::format("  reserve   {} per GPU (CUDA context, NCCL buffers)\n",
                                     format_bytes(options.reserve_full_scale))
                       : fmt::format("  reserve   {} at full scale / {} = {} per rank (CUDA context, NCCL buffers)\n",
                                     format_bytes(options.reserve_full_scale), k2, format_bytes(reserve));
  if (options.device == "cuda" && !options.plan) {
    text += fmt::format(
        "  device    cuda: buffers on real GPUs (rank r on GPU local rank % GPUs on its host), the math in "
        "CUDA kernels and cuBLAS; collectives over NCCL when every rank has a GPU of its own, else "
        "MPI\n");
  }
  text += fmt::format("  on OOM    {}\n",
                      options.strict_oom ? "abort at once (strict)" : "finish the step over the cap, then report");
  if (binding.oversubscribed) {
    text += fmt::format("  placement oversubscribed: {} ranks share {} cores on this host; ranks are not bound\n",
                        mpi.local_size(), host.cores);
  }
  for (int r = 0; r < mpi.world(); ++r) text += fmt::format("  rank {:<4} {}\n", r, placements[r]);
  if (!options.plan) {
    text += fmt::format("\n{}", run_shrink_report(options, k).format());
  }
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace emu::app
