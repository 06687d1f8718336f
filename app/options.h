// The emu command line: what a run was asked to do, validated once at start-up on every rank.
//
// Flags follow what PyTorch and DeepSpeed users expect (micro-batch, gradient accumulation, activation
// checkpointing, optimizer offload, a DeepSpeed JSON config that runs as it is). Sizes of the model are given at
// full scale (--seq-len 4096 for Llama 2); emu shrinks them by k.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "app/faults.h"
#include "emu/cap_spec.h"
#include "emu/memory.h"
#include "strategies/strategy.h"
#include "workloads/model/config.h"

namespace emu::app {

// "--expect zero3=fit": a verdict a CI job relies on; a run that disagrees exits with code 1.
struct Expectation {
  std::string strategy;  // a strategy name, or "all"
  bool fit = true;       // fit, or oom
};

struct RunOptions {
  // The model.
  std::string model = "llama2-13b";  // a preset or a Hugging Face config.json
  model::ModelConfig full;           // its full-scale shapes, with --seq-len and --micro-batch applied
  int shrink = 0;                    // k; 0 until chosen (model::default_shrink)
  bool shrink_chosen = false;        // k came from the default rule, not from --shrink
  model::ModelOptions model_options;

  // Training.
  std::vector<strategy::StrategyOptions> strategies;  // in the order they run
  int steps = 3;
  int accumulation = 1;
  // pp: micro-batches per step through the pipeline (global batch M × micro-batch); 0: ranks × accumulation, the
  // global batch of the data-parallel strategies beside it.
  int micro_batches = 0;
  bool offload = false;
  std::string collectives;            // "all_reduce=ring,all_gather=mpi"
  int ranks_per_node = 0;             // 0: the ranks found on each host
  std::string deepspeed;              // the DeepSpeed config the strategy knobs came from, if any
  std::vector<std::string> warnings;  // about the inputs, printed once per job (by rank 0)
  // Where the settings came from, for the header: what the DeepSpeed config set ("zero_optimization.stage 2"), the
  // keys it left "auto", and the flags that overrode it ("--precision fp32 over bf16.enabled true").
  std::vector<std::string> deepspeed_sets, deepspeed_auto, overridden;
  std::string tokens_path;        // a token file to train on; empty: seeded synthetic tokens
  int token_bits = 16;            // its ids: 16 or 32 bits, little-endian
  std::string load_weights_path;  // safetensors weights to start from; empty: the seeded initialisation
  std::string save_weights_path;  // where the first strategy's trained weights go (safetensors); empty: nowhere

  // The emulated GPU.
  std::string device = "cpu";  // its backend: "cpu" or "cuda" (EMU_CUDA builds); --plan accounts shapes only
  CapSpec cap = parse_cap_spec("none");
  uint64_t reserve_full_scale = 0;  // fixed overheads at full scale; each rank is charged reserve / k²
  bool strict_oom = false;
  AllocatorKind allocator = AllocatorKind::kCaching;  // what the cap is checked against: reserved or allocated
  AllocatorConfig alloc_conf;                         // --alloc-conf, PYTORCH_CUDA_ALLOC_CONF's syntax

  // Modes.
  bool plan = false;       // shapes only, at full scale, for plan_ranks ranks
  int plan_ranks = 0;      // 0: the ranks emu runs on
  std::string find_limit;  // "", "micro-batch" or "seq-len"
  // The advisor (advisor.h): searches the knobs a user has when nothing fits, or on request.
  bool advise = false;          // --advise: search even when a strategy fits
  bool no_advise = false;       // --no-advise: not even when nothing fits
  int advise_max_gpus = 0;      // --advise-max-gpus: the most GPUs a suggestion may use; 0: twice the ranks asked
  bool advise_seq_len = false;  // --advise-seq-len: suggestions may shorten the sequence
  // The command line as typed (argv[0], then the arguments), which the advice's command lines start from.
  std::string program;
  std::vector<std::string> arguments;

  // Faults and their detection.
  std::vector<Fault> faults;
  double watchdog_seconds = 300;   // a collective that takes longer ends the job (exit code 3); 0 turns it off
  bool check_collectives = false;  // ranks compare each collective before it runs

  // The step-time prediction (step_time.h): a hardware name or JSON file ("" : none), GPUs per node (0: the
  // hardware's), and "matmul=0.7,..." overriding the achievable fractions.
  std::string hardware;
  int gpus_per_node = 0;
  std::string achievable;

  // Outputs.
  std::string json_path, trace_path, svg_path;
  std::vector<Expectation> expectations;
  std::string log_spec;
};

// What parse_command_line decided.
struct ParsedCommandLine {
  enum class Action { kRun, kPrintAndExit } action = Action::kRun;
  std::string text_to_print;  // --help / --version output, printed by rank 0
  RunOptions options;
};

// Throws InputError (exit code 2) naming the bad value and the accepted range. `world` is the number of ranks,
// for checks that depend on it (a DeepSpeed train_batch_size).
ParsedCommandLine parse_command_line(int argc, const char* const* argv, int world = 1);

// pp's micro-batches per step for a run or plan over `ranks` ranks (RunOptions::micro_batches).
int pipeline_micro_batches(const RunOptions& options, int ranks);

}  // namespace emu::app
