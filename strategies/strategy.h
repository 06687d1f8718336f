// A parallel training strategy: how the model's parameters, gradients and optimizer state are placed on the
// ranks, and which collectives keep them consistent. Applied to a model that knows nothing of it (STYLE 5): the
// strategy binds each unit's weights and gradients and acts in the model's hooks (model.h).
//
//   ddp            full replica; gradient buckets all-reduced as they fill in backward (PyTorch DDP)
//   ddp-zero       DDP with PyTorch's ZeroRedundancyOptimizer: AdamW state for the whole tensors a rank owns,
//                  updated parameters broadcast from their owners
//   zero0          DeepSpeed without ZeRO (a config's stage 0): a bf16 replica, DeepSpeed's bf16 all-reduce after
//                  backward, FP16_UnfusedOptimizer's fp32 copies of every tensor over a client torch AdamW (ddp.cpp)
//   zero1, zero2   optimizer state (and, for 2, gradients) partitioned; reduce-scatter + all-gather (DeepSpeed)
//   zero3          parameters partitioned too, gathered per unit before use and released after (DeepSpeed)
//   fsdp           one flat parameter per unit, FULL_SHARD / SHARD_GRAD_OP / NO_SHARD / HYBRID_SHARD (PyTorch FSDP)
//   fsdp2          every parameter sharded on dim 0, fully_shard per block and the root (PyTorch FSDP2, fsdp2.cpp);
//                  with --tp T over tensor-parallel layers, sharded over the N/T replicas (torchtitan's 2-D mesh);
//                  with --pp P over pipeline stages, each sharded over its replicas (torchtitan's PP × FSDP2; with
//                  --tp too its 3-D, `3d` in --strategies); zero3 and fsdp with --tp T likewise over the N/T
//                  replicas of tensor-parallel layers (sharded_units.h)
//   pp             pipeline parallelism: the blocks in one stage per rank, GPipe or 1F1B micro-batch schedules,
//                  activations passed stage to stage by send/recv (Megatron-LM / DeepSpeed pipeline, pipeline.cpp)
//   tp             tensor parallelism: every matrix split over the ranks, column- then row-parallel, vocabulary-
//                  parallel embedding, head and cross-entropy, activations all-reduced (Megatron-LM,
//                  tensor_parallel.cpp)
// One file per family (ddp.cpp, zero12.cpp, zero3.cpp, fsdp.cpp), its analytic predictor beside it (ddp_model.cpp,
// zero12_model.cpp, zero3_model.cpp, fsdp_model.cpp; analytic.h); zero3 and fsdp share sharded_units.h.
//
// Every strategy trains the same numbers: the gradient of a step is the mean over the global batch (N ranks ×
// micro-batch × accumulation steps), clipped by its global norm, and AdamW updates the same fp32 values a single
// device would. Buckets, thresholds and prefetch sizes are given at full scale, as PyTorch and DeepSpeed state
// them, and divided by k² like every other memory term.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/communicator.h"
#include "emu/units.h"
#include "workloads/data/token_source.h"
#include "workloads/model/model.h"
#include "workloads/optim/adamw.h"
#include "workloads/optim/precision.h"
#include "workloads/optim/step_temporaries.h"

namespace emu::strategy {

enum class StrategyKind : uint8_t {
  kDdp,
  kZero1,
  kZero2,
  kZero3,
  kFsdp,
  kFsdp2,
  kDdpZero,
  kPipeline,
  kTensor,
  kZero0,
};

// FSDP's sharding strategies.
enum class Sharding : uint8_t {
  kFullShard,    // parameters, gradients and optimizer state sharded; parameters freed after forward
  kShardGradOp,  // as FULL_SHARD, but gathered parameters kept from forward until the end of backward
  kNoShard,      // a replica per rank, gradients all-reduced (DDP through FSDP)
  kHybridShard,  // FULL_SHARD inside a node, replicated across nodes
};
enum class BackwardPrefetch : uint8_t {
  kPre,   // gather the next unit before computing this unit's gradients (two gathered units at once)
  kPost,  // gather the next unit after computing this unit's gradients, before reducing them
  kNone,
};

// DDP's communication hook (register_comm_hook): none all-reduces the buckets at the gradients' dtype;
// bf16 is torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook (each bucket cast to a
// bf16 temporary, all-reduced in bf16, copied back).
enum class CommHook : uint8_t { kNone, kBf16 };
std::vector<std::string> comm_hook_names();  // "none", "bf16"

// PyTorch DistributedDataParallel's knobs, at full scale.
struct DdpOptions {
  uint64_t bucket_bytes = 25 * kMiB;       // bucket_cap_mb
  uint64_t first_bucket_bytes = 1 * kMiB;  // the first bucket, so that communication starts early
  bool gradient_as_bucket_view = false;    // gradients are views into the buckets: no bucket copies
  CommHook comm_hook = CommHook::kNone;
};

// DeepSpeed zero_optimization's knobs, at full scale (elements, as DeepSpeed counts them).
struct ZeroOptions {
  uint64_t reduce_bucket_elements = 500'000'000;
  uint64_t allgather_bucket_elements = 500'000'000;
  bool overlap_comm = false;  // stage 2: two reduce buckets alternate (DeepSpeed's double ipg buffer)
  uint64_t prefetch_bucket_elements = 50'000'000;  // stage 3: stage3_prefetch_bucket_size
  uint64_t param_persistence_threshold = 100'000;  // stage 3: tensors at most this large stay gathered
  uint64_t max_live_parameters = 1'000'000'000;    // stage 3: gathered elements alive at once
  // stage 3: stage3_max_reuse_distance: a tensor is kept gathered after its use when it is used again before this
  // many elements of the trace (zero3_modules.h).
  uint64_t max_reuse_distance = 1'000'000'000;
  // stage 3: offload_param.device "cpu": the bit16 parameter partitions live in host memory and each fetch copies
  // the partition up over PCIe before its all-gather (StrategyContext::parameter_host).
  bool offload_param = false;
  // stage 3: step() updates the partition sub_group_size elements at a time, each sub-group's gradients flattened
  // and cast to fp32 for its step.
  uint64_t sub_group_size = 1'000'000'000;
  // A DeepSpeed config's optimizer.params.torch_adam: stages 1-3 step torch.optim.AdamW (with the step temporaries
  // of adamw_impl, optim/step_temporaries.h) over the rank's fp32 partition instead of DeepSpeed's FusedAdam (none).
  bool torch_adam = false;
  // A DeepSpeed config's data_types.grad_accum_dtype "fp32" under bf16 without optimizer offload. At stage 1
  // DeepSpeed runs BF16_Optimizer (runtime/bf16_optimizer.py) instead of its ZeRO optimizer (zero12.cpp): an fp32
  // gradient buffer over the whole flat group, autograd's bf16 .grad kept to the step, all-reduced (no reduce bucket).
  // At stage 2 its ZeRO optimizer reduces into a compact fp32 partition of S elements instead of grads_in_partition.
  bool fp32_grad_accumulation = false;
  // use_multi_rank_bucket_allreduce (DeepSpeed's default true): stages 1 and 2 all-reduce each bucket's slices, one
  // per owner, together (allreduce_and_scatter); false reduces each owner's slices to that owner (dist.reduce,
  // allreduce_no_retain with its rank): half the bytes, and only the owner holds the sum.
  bool multi_rank_bucket_allreduce = true;
  // contiguous_gradients (DeepSpeed's default true; forced on under optimizer offload). False, at stage 1: no ipg
  // bucket buffer; autograd's .grads stay pending and every .grad is kept to step(), each bucket of several tensors
  // flattened into a temporary and all-reduced whole (buffered_reduce_fallback), no grads_in_partition.
  bool contiguous_gradients = true;
};

// PyTorch FullyShardedDataParallel's knobs.
struct FsdpOptions {
  Sharding sharding = Sharding::kFullShard;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
};

// PyTorch fully_shard's knobs (FSDP2, fsdp2.cpp).
struct Fsdp2Options {
  // reshard_after_forward=True frees each block's unsharded parameters after its forward and all-gathers them again
  // for its backward; False keeps them from forward to backward (one all-gather per block).
  bool reshard_after_forward = true;
  // reshard_after_forward=M (an int): after its forward each block keeps 1/M of its unsharded parameters and is
  // all-gathered in backward within M ranks (the context's post_forward group); 0: not used.
  int post_forward_ranks = 0;
};

// Pipeline parallelism's schedule (pipeline.cpp): GPipe (all forwards, then all backwards) or 1F1B
// (Megatron-LM's PipeDream-Flush).
enum class Schedule : uint8_t { kGpipe, k1F1B };
std::vector<std::string> schedule_names();  // "gpipe", "1f1b"
struct PipelineOptions {
  Schedule schedule = Schedule::k1F1B;
  // Interleaved 1F1B: model chunks per stage, V (Megatron-LM's --num-virtual-stages-per-pipeline-rank, formerly
  // --virtual-pipeline-model-parallel-size); 1: one contiguous chunk per stage (pipeline.h).
  int virtual_stages = 1;
};

// The parallel layout of tp and pp: the world of N ranks as DP × PP × TP, TP innermost (T consecutive ranks,
// inside a node), then PP, then DP, so that rank = d·P·T + p·T + t: Megatron-LM's initialize_model_parallel with
// order="tp-cp-pp-ep-dp" (megatron/core/parallel_state.py; its default "tp-cp-ep-dp-pp", like torchtitan's mesh
// ["pp", "dp_replicate", "dp_shard", "cp", "tp"], puts DP inside PP: the same groups' sizes and bytes, other links). 0
// takes the default: all ranks for the strategy's own dimension (tp: T = N; pp: P = N), 1 for the other. D = N/(T·P)
// data-parallel replicas, each training on its own slice of the global batch (Megatron's --tensor-model-parallel-size,
// --pipeline-model-parallel-size; D is what remains).
struct ParallelOptions {
  int tensor = 0;    // T (--tp)
  int pipeline = 0;  // P (--pp)
  // Megatron's --use-distributed-optimizer (ZeRO-1 over the data-parallel group): the fp32 master weights and Adam
  // moments sharded over the D replicas, the gradients reduce-scattered, the updated parameters all-gathered.
  bool distributed_optimizer = false;
};

// One rank's place in the DP × PP × TP layout (ParallelOptions).
struct Mesh {
  int tensor = 1, pipeline = 1, data = 1;  // T, P, D
  int rank = 0;                            // in the world
  int tensor_rank() const { return rank % tensor; }
  int pipeline_rank() const { return rank / tensor % pipeline; }
  int data_rank() const { return rank / (tensor * pipeline); }
};
// Whether `options` run a pipeline schedule: pp, and fsdp2 with --pp P ≥ 2 (torchtitan's PP × FSDP2, fsdp2.cpp).
bool pipelined(const struct StrategyOptions& options);
// Whether `kind` shards its units over the data-parallel group of a TP (fsdp2: and PP) layout when given degrees:
// fsdp2, zero3 and fsdp (sharded_units.h).
bool sharded_over_layout(StrategyKind kind);
// Whether a TP or PP degree of 2 or more is set (fsdp2, zero3 and fsdp then run over that layout).
bool pipelined_or_tensor(const struct StrategyOptions& options);
// Whether `options` are zero1 or zero2 over tensor-parallel layers (--tp T ≥ 2, zero12.cpp).
bool zero12_over_tensor(const struct StrategyOptions& options);
// The layout of `options` over `world` ranks, for rank `rank`: every other strategy is data-parallel over the whole
// world (T = P = 1, D = N). InputError naming the values where N is not divisible by T·P.
Mesh mesh_of(const struct StrategyOptions& options, int world, int rank);

struct StrategyOptions {
  StrategyKind kind = StrategyKind::kDdp;
  DdpOptions ddp;
  ZeroOptions zero;
  FsdpOptions fsdp;
  Fsdp2Options fsdp2;
  PipelineOptions pipeline;
  ParallelOptions parallel;  // tp and pp: T, P and the distributed optimizer
  optim::PrecisionRecipe recipe = optim::precision_recipe(optim::Recipe::kMixed);
  optim::AdamWConfig adamw;
  optim::AdamWImpl adamw_impl = optim::AdamWImpl::kForeach;  // torch.optim.AdamW's (ddp, fsdp*): its step temporaries
  optim::LrSchedule schedule;
  float clip_norm = 1.0f;  // global gradient-norm clipping; 0 turns it off
  int shrink = 1;          // k: full-scale bucket and threshold sizes are divided by k²
  uint64_t seed = 1234;    // initial weights

  // "ddp", "ddp-zero", "zero0", "zero1", "zero2", "zero3", "fsdp" (FULL_SHARD), "fsdp-grad-op", "fsdp-no-shard",
  // "fsdp-hybrid", "fsdp2", "pp", "tp"; tp and pp with a degree given name their layout, e.g. "tp2·dp2",
  // "pp2·tp2·dp2", "tp8·dp8·do" (do: the distributed optimizer), and fsdp2 over TP T "fsdp2·tp2", over PP P
  // "fsdp2·pp2", over both "fsdp2·pp2·tp8" (torchtitan's 3-D; D = N/(T·P) left implicit as FSDP2's shard group); zero3
  // and fsdp over TP T alike, "zero3·tp2", "fsdp·tp2"; once named_data is set.
  std::string name() const;
  // D of a tp or pp run whose degrees were given (set by the app and tests once the world is known): names the
  // layout; 0 leaves the plain name.
  int named_data = 0;
  // A full-scale byte or element count divided by k², at least 1.
  uint64_t scaled(uint64_t full_scale) const;
};

// Sets kind (and FSDP's sharding) from a name as StrategyOptions::name() prints it, and the recipe the framework
// really keeps (framework_recipe); InputError listing the names.
void set_kind(StrategyOptions& options, std::string_view name);
// The options with the precision recipe the strategy's framework really keeps. PyTorch DDP (ddp, ddp-zero) in the
// mixed recipe is torch.autocast(bfloat16) over the fp32 model, as the Hugging Face Trainer's bf16=True without
// DeepSpeed: fp32 parameters and gradients, AdamW on the fp32 parameters (no master copy); the model's math stays
// bf16 (the strategy binds autocast's bf16 copies of the weights) and saves what autocast saves
// (framework_model_options). Every other strategy and recipe is unchanged.
// Idempotent; make_strategy and predict apply it.
StrategyOptions with_framework_recipe(StrategyOptions options);
// The model options the strategy's framework runs the model under: `model` with autocast set where the framework
// recipe keeps fp32 parameters around bf16 math (PyTorch DDP's mixed recipe; model::ModelOptions::autocast).
model::ModelOptions framework_model_options(const StrategyOptions& options, model::ModelOptions model);
std::vector<std::string> strategy_names();

// Where a strategy runs: its rank's device, the world communicator (its ledger is the training traffic), the
// model (whose config's micro-batch is this rank's), for hybrid sharding the node-local group and the group of
// the same local rank across nodes (as FSDP takes a device mesh), and where the optimizer lives.
struct StrategyContext {
  Device& device;
  coll::Communicator& world;
  model::Model& model;
  coll::Communicator* intra_node = nullptr;  // HYBRID_SHARD's shard group
  coll::Communicator* inter_node = nullptr;  // HYBRID_SHARD's replica group
  // Optimizer CPU offload: master weights and Adam moments live on this (host) device, off the cap; null keeps
  // them on `device`.
  Device* offload = nullptr;
  // ZeRO-3 parameter offload (ZeroOptions::offload_param): the parameter partitions live on this (host) device.
  Device* parameter_host = nullptr;
  // FSDP2's reshard_after_forward=M: this rank's group of M consecutive ranks (fsdp2.cpp).
  coll::Communicator* post_forward = nullptr;
};

// Bytes over PCIe per rank when the optimizer is offloaded (gradients down, updated parameters up) or ZeRO-3's
// parameters are (each partition up before its all-gather).
struct HostTraffic {
  uint64_t device_to_host = 0;
  uint64_t host_to_device = 0;
};

struct StepResult {
  float loss = 0;        // this rank's mean loss over its micro-batches
  double grad_norm = 0;  // global norm of the mean gradient, before clipping
  double seconds = 0;
};

class Strategy : protected model::Hooks {
 public:
  Strategy(StrategyContext context, StrategyOptions options);
  ~Strategy() override;

  const StrategyOptions& options() const { return options_; }
  std::string name() const { return options_.name(); }

  // Allocates this rank's parameters, gradients and optimizer state and sets the same initial weights a single
  // device would have. May throw OutOfMemoryError (strict mode).
  virtual void setup() = 0;
  // One optimizer step over this rank's micro-batches (each [b, s]): forward and backward of each, reduction,
  // global-norm clipping, AdamW, and whatever makes the parameters whole again.
  StepResult step(std::span<const data::Batch> micro_batches);
  // The whole of `unit`'s weights in fp32 (the master values when the recipe keeps them), on every rank.
  // Collective over the world.
  virtual std::vector<float> full_weights(int unit) = 0;
  // The communicators whose ledgers hold this strategy's traffic: the world, and any groups it split off.
  virtual std::vector<coll::Communicator*> groups() { return {&world_}; }
  // PCIe bytes moved by optimizer offload so far.
  const HostTraffic& host_traffic() const { return host_traffic_; }

  // Told of each span of a step's work on this rank, for traces: "forward, block 3", "backward, root" (category
  // "compute", from before the unit's hook to after its closing hook, so what the hooks do is inside),
  // "gradient reduction" (category "collective") and "optimizer step" (category "optimizer"). Times are
  // steady_clock seconds since the clock's epoch. Unset, the model calls the strategy's hooks directly.
  using SpanSink =
      std::function<void(std::string_view name, std::string_view category, double start_seconds, double end_seconds)>;
  void set_span_sink(SpanSink sink) { span_sink_ = std::move(sink); }

 protected:
  // Runs the forwards and backwards of one step's micro-batches through the model with `hooks` and returns the sum
  // of their losses: by default each micro-batch's forward then its backward, in turn (begin_micro_batch before
  // each). A pipeline schedule interleaves them differently.
  virtual double run_micro_batches(std::span<const data::Batch> micro_batches, model::Hooks& hooks);
  // Called before micro-batch `index` of `count`; DDP skips its all-reduce on all but the last (no_sync).
  virtual void begin_micro_batch(int index, int count) {}
  // After the last backward: gradients are reduced to wherever the optimizer reads them.
  virtual void finish_gradients() {}
  // Sum of squares of the (rank-averaged, not yet accumulation-averaged) gradients this rank owns, summed over
  // the ranks that together own each element once.
  virtual double gradient_sum_of_squares() = 0;
  // One AdamW step at learning rate `lr`, gradients multiplied by `grad_scale`; then parameters made whole.
  virtual void update(double lr, float grad_scale) = 0;
  // The element counts of the tensors torch.optim.AdamW steps over on this rank, as a shrunk run charges them
  // (norm weights and biases ÷ k, model/shrink.h), whose step temporaries (optim/step_temporaries.h) are charged
  // around update(); empty for DeepSpeed's own optimizer.
  virtual std::vector<uint64_t> optimizer_tensors() const { return {}; }

  // Σ over the world of a local double (the gradient norm's partial sums), on every rank.
  double sum_over_world(double local, std::string_view phase);
  // Σ over `group` alike.
  double sum_over(coll::Communicator& group, double local, std::string_view phase);
  // A sub-group of the world: this rank is `rank` of `size` in the group of colour `color` (ranks ordered by
  // world rank), named `name` in its ledger. Collective over the world on a device that holds data; a plan's world
  // is virtual (collectives/virtual), and so is the group.
  std::unique_ptr<coll::Communicator> split_group(int color, int rank, int size, const std::string& name);
  // The groups of this rank in the DP × PP × TP layout `mesh` (rank = d·P·T + p·T + t) that tp, fsdp2 --tp/--pp and
  // zero1/2 --tp split off the world: the "tensor-parallel d·P + p" group of the T consecutive ranks of its stage,
  // and the "data-parallel p·T + t" group of the D ranks holding the same stage and TP slice.
  std::unique_ptr<coll::Communicator> split_tensor_group(const Mesh& mesh);
  std::unique_ptr<coll::Communicator> split_data_group(const Mesh& mesh);
  // The device the optimizer state lives on: the host under offload, else this rank's device.
  Device& optimizer_device() { return context_.offload != nullptr ? *context_.offload : device_; }
  // Counts an offloaded optimizer step over `elements` (as a shrunk run charges them, model/shrink.h): their
  // gradients down (`gradient_bytes` each, the recipe's gradient dtype unless given), their parameters back up.
  void count_offload(size_t elements, size_t gradient_bytes = 0);

  StrategyContext context_;
  StrategyOptions options_;
  int64_t steps_ = 0;  // optimizer steps taken
  HostTraffic host_traffic_;
  model::Model& model_;
  Device& device_;
  coll::Communicator& world_;

 private:
  class SpanHooks;
  // Runs `work` as a span named `name` when a sink is set.
  template <typename Work>
  void record_span(std::string_view name, std::string_view category, Work&& work);

  SpanSink span_sink_;
};

std::unique_ptr<Strategy> make_strategy(StrategyContext context, const StrategyOptions& options);

}  // namespace emu::strategy
