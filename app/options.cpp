#include "app/options.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <utility>

#include "app/deepspeed.h"
#include "app/step_time.h"
#include "emu/backend.h"
#include "emu/check.h"
#include "emu/hardware.h"
#include "emu/log.h"
#include "emu/units.h"
#include "workloads/model/layout.h"
#include "workloads/model/shrink.h"
#include "workloads/model/tensor_parallel.h"

namespace emu::app {
namespace {

constexpr int kMaxRanks = 1 << 20;
const std::vector<std::string> kDefaultStrategies = {"ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "fsdp2"};

uint64_t parse_reserve(const std::string& text) {
  if (text == "0") return 0;
  const CapSpec spec = parse_cap_spec(text);
  if (spec.unlimited || spec.scaled || !spec.gpu.empty()) {
    throw InputError(fmt::format("--reserve '{}' must be a plain size such as 1GiB, 512MB or 0", text));
  }
  return spec.bytes;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// What a user calls a Hugging Face model: the config's own `_name_or_path` when it names one, else the folder
// holding config.json (a snapshot's folder is named after the model), else the file's stem ("tinyllama.json").
std::string hf_model_name(const std::filesystem::path& given) {
  std::error_code error;
  const bool folder = std::filesystem::is_directory(given, error);
  const std::filesystem::path file = folder ? given / "config.json" : given;
  std::ifstream in(file);
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (config.is_object() && config.contains("_name_or_path") && config["_name_or_path"].is_string()) {
    const std::string named = config["_name_or_path"].get<std::string>();
    // A repository id ("TinyLlama/TinyLlama-1.1B-Chat-v1.0") or a local path: its last part is the model's name.
    std::string last = std::filesystem::path(named).filename().string();
    if (!last.empty() && last != "." && last != "config.json") return last;
  }
  const std::filesystem::path absolute = std::filesystem::absolute(file, error).lexically_normal();
  if (file.filename() == "config.json" && absolute.has_parent_path() && !absolute.parent_path().filename().empty()) {
    return absolute.parent_path().filename().string();
  }
  return file.stem().string();
}

model::ModelConfig load_model(const std::string& name) {
  std::error_code error;
  if (name.ends_with(".json") || name.find('/') != std::string::npos || std::filesystem::is_directory(name, error)) {
    model::ModelConfig config = model::load_hf_config(name);  // a config.json, or a snapshot folder holding one
    config.name = hf_model_name(name);  // the path itself stays in the header and the JSON's config.model
    return config;
  }
  return model::preset(name);
}

// `run`: the strategies this run runs; an expectation about any other is bad input.
std::vector<Expectation> parse_expectations(const std::vector<std::string>& texts,
                                            const std::vector<strategy::StrategyOptions>& run) {
  std::vector<std::string> running;
  running.reserve(run.size());
  for (const strategy::StrategyOptions& one : run) running.push_back(one.name());
  std::vector<Expectation> out;
  for (const std::string& text : texts) {
    for (const std::string& item : split_list(text)) {
      const size_t equals = item.find('=');
      const std::string who = equals == std::string::npos ? "all" : item.substr(0, equals);
      const std::string what = equals == std::string::npos ? item : item.substr(equals + 1);
      if (what != "fit" && what != "oom") {
        throw InputError(
            fmt::format("--expect '{}': the verdict '{}' is not 'fit' or 'oom' (e.g. --expect fit, "
                        "--expect zero3=fit,ddp=oom)",
                        item, what));
      }
      if (who != "all") {
        strategy::StrategyOptions probe;
        strategy::set_kind(probe, who);  // InputError listing the names
        if (std::find(running.begin(), running.end(), who) == running.end()) {
          throw InputError(fmt::format("--expect '{}': {} does not run; the strategies that run: {} (--strategies)",
                                       item, who, fmt::join(running, ", ")));
        }
      }
      out.push_back({who, what == "fit"});
    }
  }
  return out;
}

// The value of `names` that `text` is, in the same order as `values`; InputError listing the choices otherwise.
template <typename T>
T parse_choice(std::string_view flag, const std::string& text, const std::vector<std::string>& names,
               std::initializer_list<T> values) {
  const auto found = std::find(names.begin(), names.end(), text);
  if (found == names.end()) {
    throw InputError(fmt::format("{} '{}' is not one of {}", flag, text, fmt::join(names, ", ")));
  }
  return *(values.begin() + (found - names.begin()));
}

// The flags' values as typed, before they are checked and turned into RunOptions.
struct Flags {
  std::string cap = "none", reserve = "1GiB", precision = "mixed", attention = "sdpa", loss = "trainer",
              adamw = "foreach", comm_hook = "none", schedule = "1f1b", recompute;
  std::string allocator = "caching", alloc_conf;
  std::string strategies, plan;
  std::vector<std::string> expect, faults;
  int shrink = 0;
  int64_t seq_len = 0, micro_batch = 0;
  int accumulation = 0;
  uint64_t seed = 1234;
  double lr = 0, clip = -1;
  bool bucket_view = false;
  bool offload_param = false;
  int tp = 0, pp = 0;      // --tp, --pp; 0: not given
  int virtual_stages = 1;  // --virtual-stages
  bool distributed_optimizer = false;
  std::string reshard_after_forward;  // empty: fully_shard's default
  // Given on the command line, so that an explicit 0 or '' is checked rather than taken for "not given".
  bool micro_batches_given = false;  // --micro-batches, whose 0 is not accepted (0 in RunOptions: the default)
  bool strategies_given = false, seq_len_given = false, micro_batch_given = false, accumulation_given = false,
       precision_given = false, attention_given = false, checkpoint_given = false, adamw_given = false;
};

void read_parallel_layout(RunOptions& options, const Flags& flags, int ranks);  // --tp, --pp

// Flags are declared in the order --help lists them: group by group, as below.
void add_model_flags(CLI::App& app, RunOptions& options, Flags& flags) {
  app.add_option("--model", options.model,
                 fmt::format("a preset ({}) or a Hugging Face config.json", fmt::join(model::preset_names(), ", ")))
      ->capture_default_str()
      ->group("Model");
  app.add_option("--shrink,-k", flags.shrink,
                 "shrink factor k: hidden, FFN, vocabulary and sequence length / k, every memory term / k^2 "
                 "(default: the smallest k that leaves at most 4M parameters and 16 GFLOP per micro-batch step)")
      ->group("Model");
  app.add_option("--seq-len", flags.seq_len,
                 "sequence length at full scale (default: the pre-training context, at most 8192)")
      ->group("Model");
  app.add_option("--micro-batch", flags.micro_batch, "sequences per micro-batch per GPU (default 1)")->group("Model");
  app.add_option("--attention", flags.attention,
                 "Hugging Face's attn_implementation: sdpa (transformers' default; output and a logsumexp per row "
                 "saved), eager (the softmax of the score matrix saved: fp32 plus a bf16 copy for Llama) or flash "
                 "(flash_attention_2)")
      ->capture_default_str()
      ->group("Model");
  app.add_option("--loss", flags.loss,
                 "trainer (as the Hugging Face Trainer computes it: logits, their fp32 upcast and an fp32 "
                 "log-softmax, 10 B per logit in bf16) or fused (one fp32 [tokens, vocab] buffer, as fused or "
                 "chunked cross-entropy kernels)")
      ->capture_default_str()
      ->group("Model");
  app.add_option("--load-weights", options.load_weights_path,
                 "start from safetensors weights with Hugging Face names (save_pretrained's model.safetensors) "
                 "instead of the seeded initialisation; their shapes must be the run's, so a full-size checkpoint "
                 "needs --shrink 1")
      ->group("Model");
  app.add_option("--save-weights", options.save_weights_path,
                 "write the weights the first strategy has after its last step to FILE (safetensors with Hugging "
                 "Face names, fp32; every strategy trains the same numbers)")
      ->group("Model");
  options.model_options.checkpoint = true;
  app.add_flag("--checkpoint,!--no-checkpoint", options.model_options.checkpoint,
               "activation checkpointing per block, as gradient_checkpointing=True (default: on)")
      ->group("Model");
  app.add_option("--recompute", flags.recompute,
                 "what backward recomputes, as Megatron-LM's --recompute-granularity: full (= --checkpoint, every "
                 "block's forward), selective (only the attention core: q.k^T, softmax, attention over v; nothing of "
                 "it saved) or none (= --no-checkpoint)")
      ->group("Model");
  app.add_flag("--sequence-parallel", options.model_options.sequence_parallel,
               "tp, pp --tp and fsdp2 --tp: Megatron-LM's --sequence-parallel: norms and the residual stream on 1/t of "
               "the sequence, each all-reduce a reduce-scatter and an all-gather")
      ->group("Model");
}

void add_training_flags(CLI::App& app, RunOptions& options, Flags& flags) {
  app.add_option("--strategies", flags.strategies,
                 fmt::format("comma-separated, run in order: {} (default: {})",
                             fmt::join(strategy::strategy_names(), ", "), fmt::join(kDefaultStrategies, ",")))
      ->group("Training");
  app.add_option("--precision", flags.precision,
                 "mixed (bf16 + fp32 master, 16 B/param; ddp and ddp-zero: torch.autocast over fp32 weights and "
                 "gradients, no master), bf16 (8 B/param) or fp32")
      ->capture_default_str()
      ->group("Training");
  app.add_option("--adamw", flags.adamw,
                 "torch.optim.AdamW's implementation for ddp, zero0 (the torch AdamW DeepSpeed wraps) and fsdp*: "
                 "foreach (PyTorch's default; a temporary of the local optimizer state's size at step()), single "
                 "(for-loop; two of the largest tensor's) or fused (none). zero1/2/3 use DeepSpeed's FusedAdam "
                 "(none), or torch's with a DeepSpeed config's torch_adam")
      ->capture_default_str()
      ->group("Training");
  app.add_option("--steps", options.steps,
                 "optimizer steps per strategy; 0: set-up only (with --save-weights, the initial weights)")
      ->capture_default_str()
      ->group("Training");
  app.add_option("--grad-accum", flags.accumulation, "micro-batches per optimizer step (default 1)")->group("Training");
  app.add_flag("--offload", options.offload, "optimizer state in host memory (ZeRO-Offload); PCIe bytes counted")
      ->group("Training");
  app.add_flag("--offload-param", flags.offload_param,
               "zero3: the parameter partitions in host memory (DeepSpeed's offload_param device cpu), each copied "
               "up over PCIe before its all-gather")
      ->group("Training");
  app.add_option("--lr", flags.lr, "peak learning rate (default 1e-3)")->group("Training");
  app.add_option("--clip", flags.clip, "gradient clipping by global norm; 0 turns it off (default 1.0)")
      ->group("Training");
  app.add_option("--seed", flags.seed, "initial weights and synthetic data")->capture_default_str()->group("Training");
  app.add_flag("--bucket-view", flags.bucket_view,
               "ddp, ddp-zero: gradient_as_bucket_view=True (the gradients are views into DDP's buckets: no bucket "
               "copies, and they stay allocated between steps)")
      ->group("Training");
  app.add_option("--schedule", flags.schedule,
                 "pp: the pipeline schedule: 1f1b (Megatron-LM's one-forward-one-backward: stage s holds at most P - s "
                 "micro-batches' activations) or gpipe (all forwards, then all backwards: every stage holds all M)")
      ->capture_default_str()
      ->group("Training");
  app.add_option(
         "--micro-batches", options.micro_batches,
         "pp: micro-batches per step through the pipeline, M (global batch M x --micro-batch per pipeline; default "
         "ranks x --grad-accum, the data-parallel strategies' global batch, or P x --grad-accum with --pp P)")
      ->group("Training");
  app.add_option("--virtual-stages,--num-virtual-stages-per-pipeline-rank", flags.virtual_stages,
                 "pp, fsdp2 --pp: interleaved 1F1B with V model chunks per stage (Megatron-LM's "
                 "--num-virtual-stages-per-pipeline-rank; --num-layers-per-virtual-pipeline-stage L/(P x V)): chunk v "
                 "of stage p holds layer group v x P + p of P x V, the bubble shrinks to (P-1)/(V x M) of the ideal "
                 "step and the point-to-point traffic grows V times; needs P >= 2, L divisible by P x V and M a "
                 "multiple of P (default 1: not interleaved); under fsdp2 each chunk is an FSDP module of its own "
                 "(torchtitan's Interleaved1F1B)")
      ->group("Training");
  app.add_option(
         "--tp", flags.tp,
         "tp: tensor-parallel size T (Megatron-LM's --tensor-model-parallel-size): groups of T consecutive "
         "ranks, data-parallel across the N/T groups (default: all ranks, T = N); with --pp, pp's stages are "
         "tensor-parallel too (TP x PP x DP, D = N/(T x P)); with fsdp2 (T of 2 or more), fully_shard over the N/T "
         "replicas of tensor-parallel layers (torchtitan's 2-D mesh); with zero1 or zero2, DeepSpeed's partitions "
         "over them (Megatron-DeepSpeed)")
      ->group("Training");
  app.add_option("--pp", flags.pp,
                 "pp: pipeline-parallel size P (Megatron-LM's --pipeline-model-parallel-size): pipelines of P "
                 "consecutive ranks, data-parallel across the N/P pipelines (default: all ranks, P = N)")
      ->group("Training");
  app.add_flag("--distributed-optimizer", flags.distributed_optimizer,
               "tp, pp with data parallelism: Megatron-LM's --use-distributed-optimizer (fp32 master weights and Adam "
               "state sharded over the data-parallel group, gradients reduce-scattered, parameters all-gathered)")
      ->group("Training");
  app.add_option("--comm-hook", flags.comm_hook,
                 "ddp, ddp-zero: DDP's communication hook: none (all-reduce the buckets at the gradients' dtype, fp32 "
                 "in the mixed recipe) or bf16 (bf16_compress_hook: each bucket cast to bf16, all-reduced, copied "
                 "back; half the bytes)")
      ->capture_default_str()
      ->group("Training");
  app.add_option("--reshard-after-forward", flags.reshard_after_forward,
                 "fsdp2: fully_shard's reshard_after_forward: true (free each block's unsharded parameters after its "
                 "forward, all-gather again in backward), false (keep them until its backward) or M, a divisor of the "
                 "ranks (keep 1/M of them, all-gathered within M consecutive ranks in backward); default true, with "
                 "--pp false (torchtitan's default under PP, the only one built there)")
      ->group("Training");
  app.add_option("--collectives", options.collectives,
                 "algorithms per collective, e.g. all_reduce=rhd,all_gather=mpi (default: ring everywhere)")
      ->group("Training");
  app.add_option("--tokens", options.tokens_path,
                 "train on a token file of raw little-endian ids, as nanoGPT and llm.c write them (default: seeded "
                 "synthetic tokens); ids must be below the model's vocabulary and are folded into a shrunk one "
                 "(id mod V/k)")
      ->group("Training");
  app.add_option("--token-bits", options.token_bits, "bits per id in the --tokens file: 16 or 32")
      ->capture_default_str()
      ->group("Training");
  app.add_option("--ranks-per-node", options.ranks_per_node,
                 "ranks per node L for HYBRID_SHARD and all_reduce=hier, ranks r*L .. r*L + L - 1 a node (default: "
                 "EMU_COLL_RANKS_PER_NODE, else the ranks on each host when each host holds consecutive ranks)")
      ->group("Training");
  app.add_option("--deepspeed", options.deepspeed,
                 "a DeepSpeed JSON config: zero_optimization, bf16/fp16, micro-batch, accumulation, clipping, "
                 "optimizer, WarmupLR")
      ->group("Training");
}

void add_emulated_gpu_flags(CLI::App& app, RunOptions& options, Flags& flags) {
  app.add_option("--device", options.device,
                 "where each rank's emulated GPU keeps its buffers and computes: cpu (host memory, OpenBLAS), or "
                 "cuda (a real GPU, cuBLAS and CUDA kernels; builds with -DEMU_CUDA=ON). Ranks on a host share its "
                 "GPUs round-robin, each under its own cap; collectives go through NCCL when every rank has a GPU of "
                 "its own, through MPI otherwise")
      ->capture_default_str()
      ->group("Emulated GPU");
  app.add_option("--cap", flags.cap, "memory per emulated GPU: " + cap_spec_help())
      ->capture_default_str()
      ->group("Emulated GPU");
  app.add_option("--reserve", flags.reserve,
                 "fixed overheads per GPU at full scale (CUDA context, NCCL buffers), inside the cap; / k^2")
      ->capture_default_str()
      ->group("Emulated GPU");
  app.add_option("--allocator", flags.allocator,
                 "caching (PyTorch's CUDA caching allocator at full scale: 512 B rounding, 2 MiB / 20 MiB segments; "
                 "the cap is checked against reserved memory, as on a GPU) or exact (against the bytes allocated)")
      ->capture_default_str()
      ->group("Emulated GPU");
  app.add_option("--alloc-conf", flags.alloc_conf,
                 "the caching allocator's knobs in PYTORCH_CUDA_ALLOC_CONF's syntax: "
                 "expandable_segments:True|False, max_split_size_mb:N (N > 20), comma-separated")
      ->group("Emulated GPU");
  app.add_flag("--strict-oom", options.strict_oom,
               "abort at the first allocation past the cap, as a GPU would, instead of finishing the step over "
               "the cap and reporting what it would have needed")
      ->group("Emulated GPU");
}

void add_mode_flags(CLI::App& app, RunOptions& options, Flags& flags) {
  app.add_option("--plan", flags.plan,
                 "shapes only, at full scale, without data: the same accounting for N ranks (e.g. --plan 1024); "
                 "'--plan' alone or '--plan 0' plans for the ranks emu runs on")
      ->expected(0, 1)
      ->default_str("0")
      ->option_text("[N]")
      ->group("Modes");
  app.add_option("--find-limit", options.find_limit,
                 "search, per strategy, the largest micro-batch or seq-len that fits the cap (shapes only)")
      ->check(CLI::IsMember({"micro-batch", "seq-len"}))
      ->group("Modes");
  app.add_flag("--advise", options.advise,
               "search the knobs a user has (strategy, GPU count, micro-batch with accumulation, checkpointing, "
               "offload, precision) with shapes-only plans and print the best configurations that fit, with their "
               "command lines (done anyway when nothing fits)")
      ->group("Modes");
  app.add_flag("--no-advise", options.no_advise, "no advice, even when nothing fits")->group("Modes");
  app.add_option("--advise-max-gpus", options.advise_max_gpus,
                 "the most GPUs a suggestion may use (default: twice the ranks asked)")
      ->group("Modes");
  app.add_flag("--advise-seq-len", options.advise_seq_len,
               "suggestions may shorten the sequence (halved up to three times)")
      ->group("Modes");
}

void add_step_time_flags(CLI::App& app, RunOptions& options) {
  app.add_option("--hardware", options.hardware,
                 "predict each strategy's step time on these GPUs: " + hardware_names() +
                     ", or a JSON file in their form (hardware/*.json)")
      ->group("Step time");
  app.add_option("--gpus-per-node", options.gpus_per_node,
                 "GPUs per node for the prediction: groups larger than a node cross the network (default: the "
                 "hardware's, 8)")
      ->group("Step time");
  app.add_option("--achievable", options.achievable,
                 "override the fractions of peak the prediction assumes, e.g. matmul=0.7,attention=0.5,memory=0.8,"
                 "intra_link=0.8,inter_link=0.9,host_link=0.8,cpu_adam=1e9")
      ->group("Step time");
}

// --hardware, --gpus-per-node and --achievable, read once so that a bad one stops the job at start-up.
void check_step_time(const RunOptions& options) {
  if (options.gpus_per_node < 0 || options.gpus_per_node > kMaxRanks) {
    throw InputError(fmt::format("--gpus-per-node {} is out of range; accepted: 1 to {} (0: the hardware's)",
                                 options.gpus_per_node, kMaxRanks));
  }
  if (options.hardware.empty() && (options.gpus_per_node > 0 || !options.achievable.empty())) {
    throw InputError("--gpus-per-node and --achievable shape the step-time prediction; give --hardware NAME too");
  }
  static_cast<void>(step_time_setting(options));
}

void add_fault_flags(CLI::App& app, RunOptions& options, Flags& flags) {
  app.add_option("--fault", flags.faults,
                 "inject a fault: delay:RANK:SECONDS (a straggler), kill:RANK:STEP, hang:RANK:STEP or "
                 "mismatch:RANK:STEP (an extra collective); may be repeated")
      ->group("Faults");
  app.add_option("--watchdog", options.watchdog_seconds,
                 "seconds a collective may take before every rank says where it waits and the job ends (exit 3); "
                 "0 turns it off")
      ->capture_default_str()
      ->group("Faults");
  app.add_flag("--check-collectives", options.check_collectives,
               "before each collective the ranks compare what they call; disagreeing ranks are named (exit 3)")
      ->group("Faults");
}

void add_output_flags(CLI::App& app, RunOptions& options, Flags& flags) {
  app.add_option("--json", options.json_path, "write the results as JSON to FILE")->group("Outputs");
  app.add_option("--trace", options.trace_path, "write a Chrome-trace / Perfetto JSON to FILE")->group("Outputs");
  app.add_option("--svg", options.svg_path, "write a picture of memory over time per rank to FILE")->group("Outputs");
  app.add_option("--expect", flags.expect,
                 "fit, oom, or per strategy (zero3=fit,ddp=oom): exit 1 when the run disagrees")
      ->group("Outputs");
  app.add_option("--log", options.log_spec, "log levels, e.g. 'info' or 'coll=trace,warn' (also EMU_LOG)")
      ->group("Outputs");
}

// Edits (insertions, deletions, substitutions, swaps of neighbours) that turn `a` into `b`.
size_t edit_distance(std::string_view a, std::string_view b) {
  // d[i][j]: the distance between a's first i characters and b's first j, a row of b.size() + 1 per i.
  const size_t width = b.size() + 1;
  std::vector<size_t> d((a.size() + 1) * width);
  for (size_t i = 0; i <= a.size(); ++i) d[i * width] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = d[(i - 1) * width + j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      size_t best = std::min({d[(i - 1) * width + j] + 1, d[i * width + j - 1] + 1, substitute});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        best = std::min(best, d[(i - 2) * width + j - 2] + 1);
      }
      d[i * width + j] = best;
    }
  }
  return d.back();
}

// "; did you mean --cap?" for an unknown --cpa: the known long flag closest to each unknown one, within 2 edits (3
// for names of 9 letters or more, so that --strategy finds --strategies). Empty when nothing is close.
std::string suggest_flags(const CLI::App& app) {
  std::vector<std::pair<std::string, std::string>> suggestions;  // {unknown, closest known}, without the dashes
  for (const std::string& arg : app.remaining(false)) {
    if (!arg.starts_with("--")) continue;
    const std::string typed = arg.substr(2, arg.find('=') - 2);  // --name or --name=value; npos - 2: to the end
    std::string best;
    size_t best_edits = std::string::npos;
    for (const CLI::Option* option : app.get_options()) {
      for (const std::string& name : option->get_lnames()) {
        const size_t edits = edit_distance(typed, name);
        if (edits <= (name.size() >= 9 ? 3 : 2) && edits < best_edits) {
          best = name;
          best_edits = edits;
        }
      }
    }
    if (!best.empty()) suggestions.emplace_back(typed, best);
  }
  if (suggestions.empty()) return "";
  if (suggestions.size() == 1) return fmt::format("; did you mean --{}?", suggestions[0].second);
  std::vector<std::string> each;
  each.reserve(suggestions.size());
  for (const auto& [typed, known] : suggestions) each.push_back(fmt::format("--{} for --{}", known, typed));
  return fmt::format("; did you mean {}?", fmt::join(each, ", "));
}

// False when the command line only asked for --help or --version: `parsed` then holds the text to print.
bool parse_flags(CLI::App& app, int argc, const char* const* argv, ParsedCommandLine& parsed) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) {
      parsed.action = ParsedCommandLine::Action::kPrintAndExit;
      parsed.text_to_print = dynamic_cast<const CLI::CallForVersion*>(&error) != nullptr
                                 ? fmt::format("emu {}\n", EMU_VERSION)
                                 : app.help();
      return false;
    }
    const std::string suggestion = dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr ? suggest_flags(app) : "";
    throw InputError(fmt::format("{}{} (see emu --help)", error.what(), suggestion));
  }
  return true;
}

void read_emulated_gpu(RunOptions& options, const Flags& flags) {
  options.cap = parse_cap_spec(flags.cap);
  options.reserve_full_scale = parse_reserve(flags.reserve);
  if (flags.allocator != "caching" && flags.allocator != "exact") {
    throw InputError(fmt::format("--allocator '{}': the allocators are caching, exact", flags.allocator));
  }
  options.allocator = flags.allocator == "caching" ? AllocatorKind::kCaching : AllocatorKind::kExact;
  options.alloc_conf = AllocatorConfig::parse(flags.alloc_conf);
  if (options.allocator == AllocatorKind::kExact && !flags.alloc_conf.empty()) {
    throw InputError(fmt::format("--alloc-conf '{}' sets the caching allocator's knobs; --allocator exact has none",
                                 flags.alloc_conf));
  }
}

// A DeepSpeed config's knobs over `base` and its strategy in `names`; its micro-batch and accumulation fill the
// flags not given, derived from train_batch_size over `ranks` data-parallel ranks as DeepSpeed derives them.
void apply_deepspeed(RunOptions& options, Flags& flags, int ranks, strategy::StrategyOptions& base,
                     std::vector<std::string>& names) {
  const DeepSpeedConfig ds = load_deepspeed_config(options.deepspeed, base);
  base = ds.knobs;
  base.seed = flags.seed;
  names = {ds.strategy};
  options.deepspeed_sets = ds.applied;
  options.deepspeed_auto = ds.left_auto;
  options.offload = options.offload || ds.offload_optimizer;
  if (!ds.ignored.empty()) {
    options.warnings.push_back(
        fmt::format("{}: not modelled by emu, ignored: {}", options.deepspeed, fmt::join(ds.ignored, ", ")));
  }
  if ((flags.micro_batch_given && flags.micro_batch < 1) || (flags.accumulation_given && flags.accumulation < 1)) {
    return;  // out of range: read_model and read_training_loop say so
  }
  int micro_batch = flags.micro_batch_given ? flags.micro_batch : ds.micro_batch;
  int accumulation = flags.accumulation_given ? flags.accumulation : ds.accumulation;
  derive_batch(ds.train_batch_size, ranks, micro_batch, accumulation, options.deepspeed);
  flags.micro_batch = micro_batch;
  flags.accumulation = accumulation;
}

// The flags given on the command line that override a setting of the DeepSpeed config: "--precision fp32 over
// bf16.enabled true", one entry per flag, for the header.
void note_overrides(RunOptions& options, const Flags& flags) {
  const auto over = [&](bool given, const std::string& flag, std::initializer_list<std::string_view> keys) {
    if (!given) return;
    std::vector<std::string> set;
    for (const std::string& applied : options.deepspeed_sets) {
      const std::string_view key = std::string_view(applied).substr(0, applied.find(' '));
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) set.push_back(applied);
    }
    if (!set.empty()) options.overridden.push_back(fmt::format("{} over {}", flag, fmt::join(set, ", ")));
  };
  over(flags.precision_given, "--precision " + flags.precision, {"bf16.enabled", "fp16.enabled"});
  over(flags.micro_batch_given, fmt::format("--micro-batch {}", flags.micro_batch), {"train_micro_batch_size_per_gpu"});
  over(flags.accumulation_given, fmt::format("--grad-accum {}", flags.accumulation), {"gradient_accumulation_steps"});
  over(flags.lr != 0, fmt::format("--lr {}", flags.lr), {"optimizer.params.lr", "scheduler.params.warmup_max_lr"});
  over(flags.clip != -1, fmt::format("--clip {}", flags.clip), {"gradient_clipping"});
  over(flags.strategies_given, "--strategies " + flags.strategies, {"zero_optimization.stage"});
  over(flags.adamw_given, "--adamw " + flags.adamw, {"optimizer.type"});
}

// fsdp2's --reshard-after-forward: true, false, or M ranks to reshard to after forward, a divisor of the `ranks`
// between 1 and `ranks` exclusive (fully_shard's "non-trivial divisor of the shard dim size").
void read_reshard_after_forward(const std::string& text, int ranks, strategy::Fsdp2Options& fsdp2) {
  if (text.empty()) return;  // fully_shard's default, true (torchtitan's under PP, false: check_sharded_tensor)
  if (text.find_first_not_of("0123456789") != std::string::npos || text.size() > 7) {
    fsdp2.reshard_after_forward = parse_choice("--reshard-after-forward", text, {"true", "false"}, {true, false});
    return;
  }
  const int m = std::stoi(text);
  if (m < 2 || m >= ranks || ranks % m != 0) {
    throw InputError(
        fmt::format("--reshard-after-forward {} on {} ranks: an int must divide the ranks and lie between "
                    "1 and {} exclusive; accepted: true, false or such a divisor",
                    m, ranks, ranks));
  }
  fsdp2.post_forward_ranks = m;
}

// zero0 is DeepSpeed's engine without ZeRO, not PyTorch DDP: it offloads nothing (DeepSpeed offloads only with
// ZeRO stages 1-3; deepspeed.cpp check_stage0_offload), and gradient_as_bucket_view and communication hooks are
// DDP's Reducer's, which DeepSpeed does not use (it all-reduces its own flat buckets at the gradients' dtype).
// Refused rather than run as something neither framework does; so are DDP's knobs with no ddp or ddp-zero asked.
void check_ddp_flags(const RunOptions& options, const Flags& flags) {
  // PyTorch DDP's own knobs, with no DDP to take them (zero0's reasons below).
  const bool ddp = std::any_of(options.strategies.begin(), options.strategies.end(), [](const auto& one) {
    return one.kind == strategy::StrategyKind::kDdp || one.kind == strategy::StrategyKind::kDdpZero;
  });
  const bool zero0 = std::any_of(options.strategies.begin(), options.strategies.end(),
                                 [](const auto& one) { return one.kind == strategy::StrategyKind::kZero0; });
  if (!ddp && !zero0 && (flags.bucket_view || flags.comm_hook != "none")) {
    throw InputError(fmt::format(
        "{} is PyTorch DDP's (DistributedDataParallel's {}) and no strategy asked takes it; accepted with ddp or "
        "ddp-zero among --strategies",
        flags.bucket_view ? "--bucket-view" : "--comm-hook " + flags.comm_hook,
        flags.bucket_view ? "gradient_as_bucket_view" : "register_comm_hook"));
  }
  if (std::none_of(options.strategies.begin(), options.strategies.end(),
                   [](const auto& one) { return one.kind == strategy::StrategyKind::kZero0; })) {
    return;
  }
  if (options.offload) {
    throw InputError(
        "--offload with zero0: DeepSpeed offloads the optimizer only with ZeRO; accepted: --offload with zero1, "
        "zero2, zero3, ddp, ddp-zero or fsdp*, and zero0 in a run without it");
  }
  if (flags.bucket_view) {
    throw InputError(
        "--bucket-view with zero0: gradient_as_bucket_view is PyTorch DDP's, and DeepSpeed's engine has none; "
        "accepted: --bucket-view with ddp or ddp-zero, and zero0 in a run without it");
  }
  if (flags.comm_hook != "none") {
    throw InputError(fmt::format(
        "--comm-hook {} with zero0: communication hooks are PyTorch DDP's, and DeepSpeed all-reduces at the "
        "gradients' dtype (bf16 in the mixed recipe); accepted: --comm-hook {} with ddp or ddp-zero, and zero0 with "
        "--comm-hook none",
        flags.comm_hook, flags.comm_hook));
  }
}

// Strategy knobs: defaults, then a DeepSpeed config, then flags. Returns the knobs every strategy shares.
strategy::StrategyOptions read_strategies(RunOptions& options, Flags& flags, int world) {
  strategy::StrategyOptions base;
  base.recipe = optim::parse_precision_recipe(flags.precision);
  base.seed = flags.seed;
  const auto read_adamw = [&] {
    base.adamw_impl = parse_choice("--adamw", flags.adamw, optim::adamw_impl_names(),
                                   {optim::AdamWImpl::kForeach, optim::AdamWImpl::kFused, optim::AdamWImpl::kSingle});
  };
  read_adamw();
  std::vector<std::string> names = kDefaultStrategies;
  if (!options.deepspeed.empty()) {
    // The config's batch arithmetic is over the ranks the run stands for: --plan N plans for N.
    apply_deepspeed(options, flags, options.plan && options.plan_ranks > 0 ? options.plan_ranks : world, base, names);
    if (flags.precision_given) base.recipe = optim::parse_precision_recipe(flags.precision);  // the flag wins
    if (flags.adamw_given) read_adamw();  // over the config's optimizer (zero0 steps its FusedAdam: deepspeed.cpp)
  }
  if (flags.lr != 0) {
    if (!(flags.lr > 0 && flags.lr < 10)) {
      throw InputError(fmt::format("--lr {} is out of range; accepted: (0, 10)", flags.lr));
    }
    base.adamw.lr = flags.lr;
  }
  if (flags.clip != -1) {
    if (!(flags.clip >= 0)) {
      throw InputError(fmt::format("--clip {} is out of range; accepted: 0 (off) or more", flags.clip));
    }
    base.clip_norm = static_cast<float>(flags.clip);
  }
  base.ddp.gradient_as_bucket_view = flags.bucket_view;
  if (flags.offload_param) base.zero.offload_param = true;  // or from the DeepSpeed config
  read_reshard_after_forward(flags.reshard_after_forward,
                             options.plan && options.plan_ranks > 0 ? options.plan_ranks : world, base.fsdp2);
  base.ddp.comm_hook = parse_choice("--comm-hook", flags.comm_hook, strategy::comm_hook_names(),
                                    {strategy::CommHook::kNone, strategy::CommHook::kBf16});
  base.pipeline.schedule = parse_choice("--schedule", flags.schedule, strategy::schedule_names(),
                                        {strategy::Schedule::kGpipe, strategy::Schedule::k1F1B});
  base.pipeline.virtual_stages = flags.virtual_stages;
  if (flags.strategies_given) names = split_list(flags.strategies);
  if (!options.deepspeed.empty()) note_overrides(options, flags);
  if (names.empty()) {
    throw InputError(fmt::format("--strategies '{}' names no strategy; accepted: one or more of {}, comma-separated",
                                 flags.strategies, fmt::join(strategy::strategy_names(), ", ")));
  }
  for (const std::string& name : names) {
    strategy::StrategyOptions one = base;
    // "3d", torchtitan's 3-D parallelism: FSDP2 over the data-parallel group of a TP × PP layout.
    if (name == "3d" && (flags.tp < 2 || flags.pp < 2)) {
      throw InputError(fmt::format(
          "--strategies 3d is torchtitan's 3-D parallelism, fsdp2 over --tp T and --pp P together (each 2 or "
          "more); given --tp {} --pp {}; accepted: --strategies 3d --tp T --pp P, or fsdp2 with --tp or --pp alone",
          flags.tp, flags.pp));
    }
    strategy::set_kind(one, name == "3d" ? "fsdp2" : name);
    options.strategies.push_back(one);
  }
  check_ddp_flags(options, flags);
  read_parallel_layout(options, flags, options.plan && options.plan_ranks > 0 ? options.plan_ranks : world);
  return base;
}

// FSDP2 over tensor-parallel layers (fsdp2 with --tp): what it does not combine with.
void check_sharded_tensor(strategy::StrategyOptions& one, const Flags& flags) {
  if (flags.pp > 1) {
    // torchtitan's apply_fsdp under PP (reshard_after_forward_policy "default"): reshard_after_forward=False, so
    // that no micro-batch gathers a block twice; the stage's backward keeps the blocks unsharded in any case
    // (set_reshard_after_backward(False)) and emu builds only that policy.
    if (!flags.reshard_after_forward.empty() && flags.reshard_after_forward != "false") {
      throw InputError(fmt::format(
          "--reshard-after-forward {} with --pp {}: fsdp2 over a pipeline runs torchtitan's default under PP, "
          "reshard_after_forward=False (each stage's blocks gathered once per step); accepted: false, or leave it "
          "out",
          flags.reshard_after_forward, flags.pp));
    }
    one.fsdp2.reshard_after_forward = false;
  }
  if (one.fsdp2.post_forward_ranks > 0) {
    throw InputError(fmt::format(
        "--reshard-after-forward {} with --tp {} --pp {}: fsdp2 over tensor- or pipeline-parallel layers reshards "
        "to its data-parallel group only; accepted: --reshard-after-forward true or false",
        one.fsdp2.post_forward_ranks, flags.tp, flags.pp));
  }
  if (flags.distributed_optimizer) {
    throw InputError(
        "--distributed-optimizer is Megatron-LM's; fsdp2 with --tp already shards the optimizer over the "
        "replicas: accepted with tp or pp among --strategies");
  }
}

// ZeRO-1/2 over tensor-parallel layers (zero1/zero2 with --tp, Megatron-DeepSpeed): what it does not combine with.
void check_zero_tensor(const strategy::StrategyOptions& one, const Flags& flags) {
  if (flags.pp > 0 && one.kind == strategy::StrategyKind::kZero2) {
    throw InputError(fmt::format(
        "--pp {} with zero2: DeepSpeed's pipeline engine refuses ZeRO stages 2 and 3 (runtime/pipe/engine.py "
        "asserts a stage below 2); accepted: zero2 --tp T without --pp, or --strategies pp --pp {} --tp {} "
        "--distributed-optimizer",
        flags.pp, flags.pp, flags.tp));
  }
  if (flags.pp > 0) {
    throw InputError(fmt::format(
        "--pp {} with zero1 --tp {}: ZeRO-1 over DeepSpeed's pipeline engine is not built; accepted: zero1 --tp T "
        "without --pp, or --strategies pp --pp {} --tp {} --distributed-optimizer (ZeRO-1 over Megatron's stages)",
        flags.pp, flags.tp, flags.pp, flags.tp));
  }
  if (flags.distributed_optimizer) {
    throw InputError(
        "--distributed-optimizer is Megatron-LM's; zero1 and zero2 with --tp already partition the optimizer over "
        "the replicas: accepted with tp or pp among --strategies");
  }
}

// ZeRO-3 and FSDP1 over tensor-parallel layers (zero3, fsdp --tp T): what they do not combine with.
void check_flat_sharded_tensor(const strategy::StrategyOptions& one, const Flags& flags, bool sequence_parallel) {
  if (flags.pp > 0 && one.kind == strategy::StrategyKind::kZero3) {
    throw InputError(fmt::format(
        "--pp {} with {}: DeepSpeed's pipeline engine refuses ZeRO stages 2 and 3 (runtime/pipe/engine.py asserts a "
        "stage below 2); accepted: zero3 with --tp alone, or --strategies pp --tp {} --pp {}",
        flags.pp, one.name(), flags.tp, flags.pp));
  }
  if (flags.pp > 0) {
    throw InputError(fmt::format(
        "--pp {} with {}: FSDP1 over pipeline stages is not built; emu's FSDP over pipeline stages is fsdp2 --pp "
        "(torchtitan's PP x FSDP2); accepted: {} with --tp alone, or fsdp2 --tp {} --pp {}",
        flags.pp, one.name(), one.name(), flags.tp, flags.pp));
  }
  if (one.kind == strategy::StrategyKind::kFsdp && one.fsdp.sharding == strategy::Sharding::kHybridShard) {
    throw InputError(fmt::format(
        "fsdp-hybrid with --tp {}: HYBRID_SHARD over tensor-parallel layers (a 3-D mesh) is not built; accepted with "
        "--tp: fsdp, fsdp-grad-op, fsdp-no-shard",
        flags.tp));
  }
  if (flags.distributed_optimizer) {
    throw InputError(fmt::format(
        "--distributed-optimizer is Megatron-LM's; {} already shards the optimizer over the replicas: accepted "
        "with tp or pp among --strategies",
        one.name()));
  }
  if (sequence_parallel) {
    throw InputError(fmt::format(
        "--sequence-parallel with {}: sequence parallelism under ZeRO-3 and FSDP1 over --tp is not built (the norm "
        "weights' partial gradients are not reduced over the TP group); accepted with tp, pp --tp T or fsdp2 --tp T, "
        "{} then "
        "without --sequence-parallel",
        one.name(), one.name()));
  }
}

// --tp or --pp given with no strategy that takes them: InputError saying which do (and why ZeRO-2/3 do not take
// --pp).
void refuse_unused_degrees(const RunOptions& options, const Flags& flags) {
  if (flags.pp > 0) {
    for (const strategy::StrategyOptions& one : options.strategies) {
      if (one.kind == strategy::StrategyKind::kZero2 || one.kind == strategy::StrategyKind::kZero3) {
        throw InputError(fmt::format(
            "--pp {} with {}: DeepSpeed's pipeline engine refuses ZeRO stages 2 and 3 (runtime/pipe/engine.py "
            "asserts a stage below 2); accepted: --strategies pp --pp {} "
            "(its replicas as Megatron-LM's DDP), with --distributed-optimizer for ZeRO-1 over them",
            flags.pp, one.name(), flags.pp));
      }
    }
  }
  if (flags.tp > 0 || flags.pp > 0) {
    throw InputError(fmt::format(
        "{} {} sets {}'s degree; accepted with {} among --strategies{}", flags.tp > 0 ? "--tp" : "--pp",
        flags.tp > 0 ? flags.tp : flags.pp, flags.tp > 0 ? "tp" : "pp", flags.tp > 0 ? "tp" : "pp",
        flags.tp > 0 && flags.pp == 0 ? " (or fsdp2, zero1, zero2, zero3, fsdp, with --tp 2 or more)" : ""));
  }
  if (flags.distributed_optimizer) {
    throw InputError(
        "--distributed-optimizer shards Megatron-LM's optimizer over tp's or pp's data-parallel "
        "replicas; accepted with --tp (tp) or --pp (pp)");
  }
}

// --tp and --pp: the degrees of tp and pp over `ranks` ranks (strategy.h ParallelOptions), the data-parallel degree
// the rest; the strategies named after their layout ("tp2·dp4").
void read_parallel_layout(RunOptions& options, const Flags& flags, int ranks) {
  const auto check = [&](std::string_view flag, int value) {
    if (value < 0 || value > kMaxRanks) {  // beyond the ranks: mesh_of's error names the ranks
      throw InputError(fmt::format("{} {} is out of range; accepted: 1 to {} (the ranks)", flag, value, ranks));
    }
  };
  check("--tp", flags.tp);
  check("--pp", flags.pp);
  bool used = false;
  for (strategy::StrategyOptions& one : options.strategies) {
    const bool tensor = one.kind == strategy::StrategyKind::kTensor;
    const bool pipeline = one.kind == strategy::StrategyKind::kPipeline;
    // FSDP2 over tensor-parallel layers: torchtitan's 2-D mesh, fully_shard over the data-parallel replicas.
    // With --pp too (--pp alone, or both: torchtitan's 3-D), fully_shard over each stage's replicas.
    const bool sharded = one.kind == strategy::StrategyKind::kFsdp2 && (flags.tp > 1 || flags.pp > 1);
    // ZeRO-1/2 over tensor-parallel layers: DeepSpeed partitioning over Megatron's data-parallel group.
    const bool zero =
        (one.kind == strategy::StrategyKind::kZero1 || one.kind == strategy::StrategyKind::kZero2) && flags.tp > 1;
    // ZeRO-3 and FSDP1 over tensor-parallel layers: sharded over the data-parallel replicas (sharded_units.h).
    const bool flat = strategy::sharded_over_layout(one.kind) && !sharded && flags.tp > 1;
    if ((!tensor || flags.tp == 0) && (!pipeline || flags.pp == 0) && !sharded && !zero && !flat) continue;
    used = true;
    if (zero) check_zero_tensor(one, flags);
    if (tensor || sharded || zero || flat) one.parallel.tensor = flags.tp;
    if (sharded) one.parallel.pipeline = flags.pp;
    if (pipeline) one.parallel.pipeline = flags.pp, one.parallel.tensor = flags.tp;  // --tp too: TP x PP
    one = strategy::with_framework_recipe(one);
    if (sharded) check_sharded_tensor(one, flags);
    if (flat) check_flat_sharded_tensor(one, flags, options.model_options.sequence_parallel);
    one.parallel.distributed_optimizer = flags.distributed_optimizer;
    one.named_data = strategy::mesh_of(one, ranks, 0).data;  // InputError unless T·P divides N
  }
  if (!used) refuse_unused_degrees(options, flags);
}

void read_training_loop(RunOptions& options, const Flags& flags, int world) {
  if (options.steps < 0 || options.steps > 100000) {
    throw InputError(fmt::format("--steps {} is out of range; accepted: 0 (set-up only) to 100000", options.steps));
  }
  options.accumulation = flags.accumulation > 0 ? flags.accumulation : 1;
  if ((flags.accumulation_given && flags.accumulation < 1) || options.accumulation > 4096) {
    throw InputError(fmt::format("--grad-accum {} is out of range; accepted: 1 to 4096", flags.accumulation));
  }
  if ((flags.micro_batches_given && options.micro_batches < 1) || options.micro_batches > 4096) {
    throw InputError(fmt::format("--micro-batches {} is out of range; accepted: 1 to 4096", options.micro_batches));
  }
  if (options.ranks_per_node < 0 || options.ranks_per_node > kMaxRanks) {
    throw InputError(
        fmt::format("--ranks-per-node {} is out of range; accepted: 1 to the number of ranks", options.ranks_per_node));
  }
  // A plan's nodes divide the ranks it plans for, not the ones it runs on.
  const int ranks = options.plan && options.plan_ranks > 0 ? options.plan_ranks : world;
  if (options.ranks_per_node > 0 && ranks % options.ranks_per_node != 0) {
    throw InputError(fmt::format("--ranks-per-node {} does not divide the {} ranks; accepted: a divisor of {}",
                                 options.ranks_per_node, ranks, ranks));
  }
}

// The model at full scale, with --seq-len and --micro-batch applied; its math in the strategies' `base` precision.
void read_model(RunOptions& options, const Flags& flags, const strategy::StrategyOptions& base) {
  options.model_options.attention =
      parse_choice("--attention", flags.attention, model::attention_names(),
                   {model::Attention::kSdpa, model::Attention::kEager, model::Attention::kFlash});
  options.model_options.loss =
      parse_choice("--loss", flags.loss, model::loss_names(), {model::Loss::kTrainer, model::Loss::kFused});
  if (!flags.recompute.empty()) {
    if (flags.checkpoint_given) {
      throw InputError(
          fmt::format("--recompute {} and --checkpoint/--no-checkpoint both say what backward "
                      "recomputes; accepted: one of them",
                      flags.recompute));
    }
    const int granularity = parse_choice("--recompute", flags.recompute, {"full", "selective", "none"}, {0, 1, 2});
    options.model_options.checkpoint = granularity == 0;
    options.model_options.selective_recompute = granularity == 1;
  }
  options.model_options.compute = base.recipe.params;
  options.full = load_model(options.model);
  // Gemma 2's soft-capped scores have no SDPA kernel: transformers loads it with eager attention by default
  // (Gemma2PreTrainedModel._supports_sdpa is False) and refuses sdpa when asked; flash_attention_2 takes the cap.
  if (options.full.attn_softcap != 0 && options.model_options.attention == model::Attention::kSdpa) {
    if (flags.attention_given) {
      throw InputError(fmt::format(
          "--attention sdpa: {} soft-caps its attention scores (attn_logit_softcapping {}), which SDPA cannot; "
          "transformers runs it with eager (its default for this model) or flash attention; accepted: eager, flash",
          options.full.name, options.full.attn_softcap));
    }
    options.model_options.attention = model::Attention::kEager;
  }
  if (flags.seq_len_given) {
    if (flags.seq_len < 1 || flags.seq_len > (1 << 20)) {
      throw InputError(fmt::format("--seq-len {} is out of range; accepted: 1 to {}", flags.seq_len, 1 << 20));
    }
    options.full.seq = flags.seq_len;
    options.full.seq_default.clear();
  }
  if (flags.micro_batch_given || flags.micro_batch != 0) {  // or from a DeepSpeed config
    if (flags.micro_batch < 1 || flags.micro_batch > 4096) {
      throw InputError(fmt::format("--micro-batch {} is out of range; accepted: 1 to 4096", flags.micro_batch));
    }
    options.full.batch = flags.micro_batch;
  }
  options.full.validate();
}

// k: --shrink when given (`given`), else model::default_shrink (parameters and FLOPs per step bounded); every strategy
// sizes its buckets by it.
void read_shrink(RunOptions& options, const Flags& flags, bool given) {
  if (given) {
    if (flags.shrink < 1) {
      throw InputError(fmt::format("--shrink {} is out of range; accepted for {}: {}", flags.shrink, options.full.name,
                                   fmt::join(model::valid_shrink_factors(options.full), ", ")));
    }
    model::shrink(options.full, flags.shrink);  // InputError listing the valid k
    options.shrink = flags.shrink;
  } else {
    options.shrink = static_cast<int>(model::default_shrink(options.full));
    options.shrink_chosen = true;
  }
  for (strategy::StrategyOptions& one : options.strategies) one.shrink = options.shrink;
}

void read_modes(RunOptions& options, const Flags& flags) {
  if (!flags.plan.empty()) {
    options.plan = true;
    try {
      size_t used = 0;
      options.plan_ranks = std::stoi(flags.plan, &used);
      if (used != flags.plan.size()) throw std::invalid_argument(flags.plan);
    } catch (const std::exception&) {
      throw InputError(fmt::format("--plan '{}' is not a number of ranks; accepted: 0 (the ranks emu runs on) to {}",
                                   flags.plan, kMaxRanks));
    }
    if (options.plan_ranks < 0 || options.plan_ranks > kMaxRanks) {
      throw InputError(fmt::format("--plan {} is out of range; accepted: 0 (the ranks emu runs on) to {}",
                                   options.plan_ranks, kMaxRanks));
    }
  }
  if (!options.find_limit.empty()) options.plan = true;  // the search plans at full scale
}

// The token file and the weights to start from, which must exist.
void check_inputs(const RunOptions& options) {
  if (options.token_bits != 16 && options.token_bits != 32) {
    throw InputError(fmt::format("--token-bits {} is not a token width; accepted: 16, 32", options.token_bits));
  }
  for (const std::string* path : {&options.tokens_path, &options.load_weights_path}) {
    if (!path->empty() && !std::filesystem::is_regular_file(*path)) {
      throw InputError(fmt::format("'{}' cannot be read: no such file", *path));
    }
  }
}

// --device: a backend this build has, and for cuda a visible GPU (a plan needs neither).
void check_device(const RunOptions& options) {
  if (options.device != "cpu" && options.device != "cuda") {
    throw InputError(fmt::format("--device '{}' is not a backend; accepted: cpu, cuda", options.device));
  }
  if (options.device == "cuda" && !options.plan) {
    if (device_backends().find("cuda") == std::string::npos) {
      throw InputError(
          fmt::format("--device cuda: this build has {} only; build with the cuda preset "
                      "(cmake --preset cuda) on a machine with the CUDA toolkit",
                      device_backends()));
    }
    if (!cuda_available()) {
      throw InputError("--device cuda: no GPU is visible to this process (check nvidia-smi, CUDA_VISIBLE_DEVICES)");
    }
    const model::ModelConfig& c = options.full;
    if (c.attn_softcap != 0 || c.final_softcap != 0 || c.query_scale != 0) {
      throw InputError(
          fmt::format("--device cuda: {}'s soft-capping and query_pre_attn_scalar are computed by the "
                      "cpu device only; accepted: --device cpu, or --plan",
                      c.name));
    }
  }
}

// Every file emu writes goes into a folder that exists, and no two outputs into the same file (the second would
// overwrite the first).
void check_outputs(const RunOptions& options) {
  const std::pair<const char*, const std::string*> outputs[] = {{"--json", &options.json_path},
                                                                {"--trace", &options.trace_path},
                                                                {"--svg", &options.svg_path},
                                                                {"--save-weights", &options.save_weights_path}};
  for (size_t i = 0; i < std::size(outputs); ++i) {
    const std::string& path = *outputs[i].second;
    if (path.empty()) continue;
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent)) {
      throw InputError(fmt::format("'{}' cannot be written: the folder '{}' does not exist", path, parent.string()));
    }
    const std::filesystem::path file = std::filesystem::absolute(path).lexically_normal();
    for (size_t j = 0; j < i; ++j) {
      const std::string& earlier = *outputs[j].second;
      if (earlier.empty() || std::filesystem::absolute(earlier).lexically_normal() != file) continue;
      throw InputError(fmt::format("{} and {} both write '{}'; accepted: a different file for each output",
                                   outputs[j].first, outputs[i].first, path));
    }
  }
}

void read_faults(RunOptions& options, const Flags& flags, int world) {
  options.faults = parse_faults(flags.faults, world, options.steps);
  if (!(options.watchdog_seconds >= 0 && options.watchdog_seconds <= 86400)) {
    throw InputError(
        fmt::format("--watchdog {} is out of range; accepted: 0 (off) to 86400 seconds", options.watchdog_seconds));
  }
}

}  // namespace

// Declares the flags group by group, parses, then reads and checks each group; the steps run in this order so that
// a command line with several errors reports the same first one every time.
int pipeline_micro_batches(const RunOptions& options, int ranks) {
  if (options.micro_batches > 0) return options.micro_batches;
  for (const strategy::StrategyOptions& one : options.strategies) {  // --pp P: P × accumulation per pipeline
    if (strategy::pipelined(one) && one.parallel.pipeline > 0) {
      return one.parallel.pipeline * options.accumulation;
    }
  }
  return ranks * options.accumulation;
}

namespace {

// Interleaved 1F1B as Megatron-LM accepts it (training/arguments.py validate_args; core/pipeline_parallel/schedules.py
// forward_backward_pipelining_with_interleaving): at least 2 stages (Megatron's overlapped p2p default), the blocks
// in P·V equal chunks, and M a multiple of P (its default group of P micro-batches per virtual stage).
void check_interleaving(const RunOptions& options, int stages, const strategy::StrategyOptions& one, int ranks) {
  const int chunks = one.pipeline.virtual_stages;
  const auto layers = static_cast<int>(options.full.layers);
  if (chunks < 1 || chunks > layers) {
    throw InputError(fmt::format("--virtual-stages {} is out of range; accepted: 1 to {} ({}'s blocks)", chunks, layers,
                                 options.full.name));
  }
  if (chunks == 1) return;
  if (one.pipeline.schedule != strategy::Schedule::k1F1B) {
    throw InputError(fmt::format("--virtual-stages {} interleaves 1F1B; accepted with --schedule 1f1b only", chunks));
  }
  if (stages < 2) {
    throw InputError(
        fmt::format("--virtual-stages {} interleaves a pipeline of {} stage; accepted: 2 stages or more "
                    "(--pp P, P >= 2)",
                    chunks, stages));
  }
  if (layers % (stages * chunks) != 0) {
    std::vector<int> accepted;
    for (int v = 1; v <= layers / stages; ++v) {
      if (layers % (stages * v) == 0) accepted.push_back(v);
    }
    throw InputError(fmt::format(
        "--virtual-stages {}: {}'s {} blocks are not divisible into P x V = {} x {} = {} equal chunks; accepted with "
        "P = {}: {}",
        chunks, options.full.name, layers, stages, chunks, stages * chunks, stages,
        accepted.empty() ? std::string("none (L is not divisible by P)")
                         : fmt::format("{}", fmt::join(accepted, ", "))));
  }
  const int micro_batches = pipeline_micro_batches(options, ranks);
  if (micro_batches % stages != 0) {
    throw InputError(fmt::format(
        "--virtual-stages {}: M = {} micro-batches is not a multiple of the {} stages, as Megatron-LM's interleaved "
        "schedule needs; accepted: --micro-batches {}, {}, {}, ...",
        chunks, micro_batches, stages, stages, 2 * stages, 3 * stages));
  }
}

// pp puts one stage on each rank: it needs a block per stage (per chunk, interleaved).
void check_pipeline(const RunOptions& options, int world) {
  const int ranks = options.plan && options.plan_ranks > 0 ? options.plan_ranks : world;
  bool pipeline = false;
  for (const strategy::StrategyOptions& one : options.strategies) {
    if (one.kind == strategy::StrategyKind::kFsdp2 && strategy::pipelined(one)) {
      const int stages = strategy::mesh_of(one, ranks, 0).pipeline;
      if (stages > options.full.layers) {
        throw InputError(fmt::format("fsdp2 with --pp {}: {} stages for {}'s {} blocks; accepted: --pp 2 to {}", stages,
                                     stages, options.full.name, options.full.layers, options.full.layers));
      }
      if (options.full.tie_embeddings) {
        throw InputError(fmt::format(
            "fsdp2 with --pp {}: {} ties its LM head to its embeddings, whose copy on the last stage FSDP2 over a "
            "pipeline does not keep in step (not built); accepted: an untied model (e.g. llama2-7b, llama2-70b), or "
            "--strategies pp for tied ones",
            stages, options.full.name));
      }
      pipeline = true;
      check_interleaving(options, stages, one, ranks);  // torchtitan's Interleaved1F1B, as pp interleaves
      continue;
    }
    if (one.kind != strategy::StrategyKind::kPipeline) continue;
    pipeline = true;
    const int stages = strategy::mesh_of(one, ranks, 0).pipeline;
    if (stages > options.full.layers) {
      throw InputError(
          fmt::format("pp runs one pipeline stage per rank: {} ranks for {}'s {} blocks; accepted: 1 to {} "
                      "ranks per pipeline (--pp P for pipelines of P ranks, data-parallel across them)",
                      stages, options.full.name, options.full.layers, options.full.layers));
    }
    check_interleaving(options, stages, one, ranks);
  }
  if (!pipeline && !options.strategies.empty() && options.strategies.front().pipeline.virtual_stages != 1) {
    throw InputError(
        fmt::format("--virtual-stages {} interleaves a pipeline's schedule; accepted with pp, or fsdp2 and 3d with "
                    "--pp, among --strategies",
                    options.strategies.front().pipeline.virtual_stages));
  }
}

// The advisor's flags, and --offload-param, which only ZeRO-3 has (DeepSpeed's offload_param is a stage-3 knob).
void read_advice(RunOptions& options, const Flags& flags, bool max_gpus_given, int world) {
  const int ranks = options.plan && options.plan_ranks > 0 ? options.plan_ranks : world;
  if (options.advise && options.no_advise) {
    throw InputError("--advise and --no-advise contradict each other; accepted: one of them");
  }
  if (max_gpus_given && (options.advise_max_gpus < ranks || options.advise_max_gpus > kMaxRanks)) {
    throw InputError(fmt::format("--advise-max-gpus {} is out of range; accepted: {} (the ranks asked) to {}",
                                 options.advise_max_gpus, ranks, kMaxRanks));
  }
  if (!max_gpus_given) options.advise_max_gpus = std::min(kMaxRanks, 2 * ranks);
  if (flags.offload_param && std::none_of(options.strategies.begin(), options.strategies.end(),
                                          [](const auto& one) { return one.kind == strategy::StrategyKind::kZero3; })) {
    throw InputError("--offload-param offloads ZeRO-3's parameter partitions; accepted with zero3 among --strategies");
  }
}

// tp splits every layer over all ranks: heads, kv heads and the FFN must divide by it, at full scale and shrunk
// (tensor_parallel.h, check_tensor_parallel).
void check_tensor(const RunOptions& options, int world) {
  const int ranks = options.plan && options.plan_ranks > 0 ? options.plan_ranks : world;
  for (const strategy::StrategyOptions& one : options.strategies) {
    const bool pipeline_tp = one.kind == strategy::StrategyKind::kPipeline && one.parallel.tensor > 1;
    const bool sharded_tp = one.kind == strategy::StrategyKind::kFsdp2 && one.parallel.tensor > 1;
    const bool zero_tp = strategy::zero12_over_tensor(one);
    const bool flat_tp = strategy::sharded_over_layout(one.kind) && !sharded_tp && one.parallel.tensor > 1;
    if (one.kind != strategy::StrategyKind::kTensor && !pipeline_tp && !sharded_tp && !zero_tp && !flat_tp) continue;
    if (options.device == "cuda" && !options.plan) {
      throw InputError(
          "tp runs its parallel cross-entropy on the host: --device cpu (or --plan); accepted for tp: cpu");
    }
    const int tp = strategy::mesh_of(one, ranks, 0).tensor;
    model::check_tensor_parallel(options.full, tp);
    if (!options.plan && options.shrink > 1) {
      model::check_tensor_parallel(model::shrink(options.full, options.shrink), tp);
    }
    if (options.model_options.sequence_parallel) {
      if (zero_tp) {
        throw InputError(fmt::format(
            "--sequence-parallel with {}: ZeRO over tensor-parallel layers runs without it (the norm gradients it "
            "leaves partial are not all-reduced over the TP group); accepted: tp, pp --tp T or fsdp2 --tp T with "
            "--sequence-parallel, {} without it",
            one.name(), one.name()));
      }
      model::check_sequence_parallel(options.full, options.model_options, tp);
      if (!options.plan && options.shrink > 1) {
        model::check_sequence_parallel(model::shrink(options.full, options.shrink), options.model_options, tp);
      }
    }
  }
  if (options.model_options.sequence_parallel &&
      std::none_of(options.strategies.begin(), options.strategies.end(), [](const auto& one) {
        return one.kind == strategy::StrategyKind::kTensor ||
               ((one.kind == strategy::StrategyKind::kPipeline || one.kind == strategy::StrategyKind::kFsdp2) &&
                one.parallel.tensor > 1);
      })) {
    throw InputError(
        "--sequence-parallel splits tp's sequence; accepted with tp, pp --tp T or fsdp2 --tp T among --strategies");
  }
}

}  // namespace

ParsedCommandLine parse_command_line(int argc, const char* const* argv, int world) {
  ParsedCommandLine parsed;
  RunOptions& options = parsed.options;
  Flags flags;
  CLI::App app{
      "emu: each MPI rank emulates one GPU with a hard memory cap and trains a scaled-down transformer under "
      "DDP, ZeRO and FSDP with real collectives, to show what fits, why, and what crosses the wire.\n\n"
      "The canonical run:  mpirun -np 8 ./emu --cap 40GB-scaled",
      "emu"};
  app.set_version_flag("--version", fmt::format("emu {}", EMU_VERSION));
  app.get_formatter()->column_width(34);
  add_model_flags(app, options, flags);
  add_training_flags(app, options, flags);
  add_emulated_gpu_flags(app, options, flags);
  add_mode_flags(app, options, flags);
  add_fault_flags(app, options, flags);
  add_output_flags(app, options, flags);
  add_step_time_flags(app, options);
  if (!parse_flags(app, argc, argv, parsed)) return parsed;
  options.program = argc > 0 ? argv[0] : "emu";
  options.arguments.assign(argv + std::min(argc, 1), argv + argc);
  flags.strategies_given = app.count("--strategies") > 0;
  flags.seq_len_given = app.count("--seq-len") > 0;
  flags.micro_batch_given = app.count("--micro-batch") > 0;
  flags.accumulation_given = app.count("--grad-accum") > 0;
  flags.micro_batches_given = app.count("--micro-batches") > 0;
  flags.precision_given = app.count("--precision") > 0;
  flags.adamw_given = app.count("--adamw") > 0;
  flags.attention_given = app.count("--attention") > 0;
  flags.checkpoint_given = app.count("--checkpoint") + app.count("--no-checkpoint") > 0;

  if (!options.log_spec.empty()) log::configure(options.log_spec);
  read_emulated_gpu(options, flags);
  read_modes(options, flags);
  const strategy::StrategyOptions base = read_strategies(options, flags, world);
  read_training_loop(options, flags, world);
  read_model(options, flags, base);
  if (!options.deepspeed.empty()) {  // "auto" bucket sizes, as the Trainer fills them from the full-scale model
    std::vector<std::string> left = options.deepspeed_auto;
    for (strategy::StrategyOptions& one : options.strategies) {
      left = options.deepspeed_auto;
      fill_auto_from_hidden(one.zero, one.kind == strategy::StrategyKind::kZero3, options.full.hidden, left);
      fill_auto_total_steps(one.schedule, options.steps, left);
    }
    options.deepspeed_auto = left;
  }
  check_pipeline(options, world);
  read_advice(options, flags, app.count("--advise-max-gpus") > 0, world);
  read_shrink(options, flags, app.count("--shrink") > 0);
  check_tensor(options, world);
  check_inputs(options);
  check_device(options);
  check_outputs(options);
  check_step_time(options);
  options.expectations = parse_expectations(flags.expect, options.strategies);
  read_faults(options, flags, world);
  return parsed;
}

}  // namespace emu::app
