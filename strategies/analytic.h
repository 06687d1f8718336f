// The analytic model: what a strategy should need per rank and move per step, from the ZeRO paper's formulas
// (Rajbhandari et al. 2020, §5: 2Ψ + 2Ψ + KΨ with K = 12 for mixed-precision Adam, divided by N as each stage
// partitions more) plus the buffers each framework adds on top. It is computed from the model's unit sizes and
// the strategy's options alone, never from a run, and printed beside what was measured.
//
// One predictor per strategy family, each beside the strategy it predicts and with its formulas in its header
// comment: ddp_model.cpp, zero12_model.cpp, zero3_model.cpp, fsdp_model.cpp, pipeline_model.cpp, tp_model.cpp. This
// file's predict() chooses one and adds the master weights and Adam moments (K bytes per parameter this rank updates).
//
// Memory is per rank and category, at the peak of a step (Ψ parameters, N ranks). Traffic is the bytes each rank
// sends per step at ring volumes: all-reduce 2(N−1)/N·S, reduce-scatter and all-gather (N−1)/N·S of a payload S
// (collectives/types.h), per call, summed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "collectives/types.h"
#include "emu/memory.h"
#include "strategies/dim0_shard.h"
#include "strategies/pipeline.h"
#include "strategies/shard.h"
#include "strategies/strategy.h"
#include "workloads/model/shrink.h"

namespace emu::strategy {

struct AnalyticInput {
  std::vector<uint64_t> unit_counts;  // n_u: root first, then blocks
  // Each unit's tensors' sizes in registration order (DeepSpeed buckets tensors); empty: one tensor per unit.
  std::vector<std::vector<uint64_t>> unit_tensors;
  // Each unit's tensors with their dim 0 (FSDP2 shards each on dim 0); empty: one 1-D tensor per unit.
  std::vector<std::vector<TensorRows>> unit_rows;
  // The same tensors as a shrunk run charges each one (model::tensor_charge: norm weights and biases ÷ k), what
  // ZeroRedundancyOptimizer partitions by and charges; empty: as held.
  std::vector<std::vector<uint64_t>> unit_tensors_charged;
  int world = 1;           // N
  int ranks_per_node = 1;  // HYBRID_SHARD's shard group
  int accumulation = 1;    // micro-batches per step
  int rank = 0;            // the rank predicted for where ranks differ (ZeroRedundancyOptimizer's whole tensors)
  // Pipeline parallelism (pp, one stage per rank): the root's elements as a shrunk run charges them on the first
  // stage (the embeddings) and on the last (final norm and head, with a tied embedding's copy), the tied
  // embedding's alone (0 when untied), and the bytes of one micro-batch's activations between two stages
  // (b·s·h at the compute dtype).
  uint64_t root_first_stage = 0, root_last_stage = 0, tied_embedding = 0;
  uint64_t boundary_bytes = 0;
  // Tensor parallelism (tp): the rows b·s of one micro-batch (the parallel cross-entropy reduces [b·s] fp32) and
  // whether blocks are checkpointed (their forward all-reduces run again in backward).
  uint64_t tokens = 0;
  bool checkpoint = false;
  // tp (and pp's or fsdp2's tensor-parallel stages) with sequence parallelism (ModelOptions::sequence_parallel), and
  // the elements the split leaves whole on every rank (the norm weights, whose gradients it all-reduces once per
  // step).
  bool sequence_parallel = false;
  uint64_t replicated_elements = 0;
  uint64_t replicated_tensors = 0;  // how many tensors those elements are in
  bool offload = false;             // --offload: the optimizer state (and ZeRO/FSDP gradient shards) on the host
  // How a shrunk run charges each unit's elements and those of all units back to back (norm weights and biases
  // ÷ k, workloads/model/shrink.h). Empty: every element as held (full scale, or an input made by hand).
  std::vector<model::ParameterCharge> unit_charge;
  model::ParameterCharge charge;
  int64_t shrink = 1;  // k the model's tensors are shrunk by (their charges are the full-scale tensors ÷ k²)
  // The largest tensor (by elements held) as a shrunk run charges that one tensor (model::tensor_charge); 0: as
  // held (an input made by hand).
  uint64_t largest_tensor_charged = 0;
  // [root tensors] whether autograd makes the tensor's gradient at the end of backward, when it reaches the
  // embeddings, rather than at its start with the LM head's (model/layout.h gradient_made_at_end); empty: none.
  std::vector<bool> root_at_end;
  // [unit][k] the layout index of the k-th tensor the unit's forward uses (module_order); empty: layout order.
  std::vector<std::vector<size_t>> forward_order;

  // Elements of the root's gradients made at the end of backward, as a shrunk run charges those tensors.
  uint64_t root_embedding_elements() const;
  // The largest root tensor whose gradient is made at the head (after the loss's backward), as a shrunk run charges
  // it.
  uint64_t root_head_tensor() const;
  // Elements of the tensors the modules after the last block use, as a shrunk run charges them (head_elements); 0:
  // none (an input made by hand).
  uint64_t head_elements = 0;
  uint64_t embedding_elements = 0;  // embedding_elements; 0: none apart (tied, or an input made by hand)

  // Every tensor in the order the module registers them (DeepSpeed's flat group's): the root's tensors made at the
  // end (the embeddings), the blocks', then the rest of the root's (the final norm, an untied head), each in the
  // elements a shrunk run charges it for (shard.h whole_tensors_meeting).
  std::vector<uint64_t> registration_order() const;

  uint64_t parameter_count() const;                     // Ψ: the sum of unit_counts
  std::vector<uint64_t> tensors_of(size_t unit) const;  // unit_tensors[unit], or {unit_counts[unit]}
  // Bytes one buffer of `elements` elements of unit `unit` (kAllUnits: of the whole flat space) is charged at
  // `dtype`, as the strategy allocates it.
  static constexpr int kAllUnits = -1;
  static constexpr int kCharged = -2;  // `elements` are already as a shrunk run charges them (per-tensor sums)
  uint64_t bytes(int unit, uint64_t elements, DType dtype) const;
  // What those elements are charged for, in elements: what full-scale limits ÷ k² are compared with.
  uint64_t elements(int unit, uint64_t elements) const;
};

// Elements, as a shrunk run charges them, of the tensors the modules after the last block use, forward then
// backward: the final norm (the root's 1-D tensors) and the LM head's V·h matrix (the embedding's when tied).
uint64_t head_elements(const model::Model& model);
// Elements, as a shrunk run charges them, of the root's tensors only its embedding modules use: the root's less
// head_elements; 0 with tied embeddings (the head uses the embedding matrix).
uint64_t embedding_elements(const model::Model& model);

// The order in which `layout`'s forward uses its tensors: Hugging Face's Llama-style decoder layer runs
// input_layernorm, q, k, v (each weight with its bias), o, the norms after attention, gate, up, down, Gemma 2's
// post_feedforward_layernorm, where the layout lists the norms after the projections; other layouts are in order.
std::vector<size_t> module_order(const model::UnitLayout& layout);

// The input for `model` as it is laid out in units.
AnalyticInput analytic_input(const model::Model& model, int world, int ranks_per_node, int accumulation);

struct PredictedTraffic {
  coll::CollectiveKind kind = coll::CollectiveKind::kAllReduce;
  std::string group;  // "world", "intra-node", "inter-node"
  uint64_t calls = 0;
  uint64_t sent = 0;  // bytes per rank per step
};

struct Prediction {
  CategoryBytes peak;       // on the device: model states and strategy buffers at their peak (activations aside)
  CategoryBytes host_peak;  // in host memory under --offload (off the cap)
  HostTraffic pcie;         // bytes per step over PCIe under --offload
  std::vector<PredictedTraffic> traffic;
  std::string formula;  // the ZeRO-paper line this strategy follows, e.g. "(2 + 2 + 12/N)Ψ"
  // Elements of torch.optim.AdamW's step temporaries at the state's dtype (foreach: every local element once;
  // single: twice the largest local tensor; fused: none), included in peak[kOptimizerState]; DDP and FSDP only.
  uint64_t step_temporary_elements = 0;

  uint64_t model_state_bytes() const;  // parameters + gradients + master weights + optimizer state
  uint64_t sent(coll::CollectiveKind kind) const;
};

Prediction predict(const StrategyOptions& options, const AnalyticInput& input);

// The rank of first..last whose bytes stand for them all in a plan. They differ only where a strategy gives whole
// tensors to ranks: ddp-zero (ZeroRedundancyOptimizer's greedy partition, each rank owning its own set of tensors)
// and, but under `offload`, zero1 and zero2 (DeepSpeed sizes a rank's gradient partition for the whole tensors
// meeting it, shard.h whole_tensors_meeting). Then the one holding the most, whose peak bounds the others'
// (`bound`); elsewhere `first`.
struct Representative {
  int rank = 0;
  bool bound = false;  // the ranks hold different bytes, at most `rank`'s
};
Representative representative_rank(const StrategyOptions& options, const model::ModelConfig& config, int ranks,
                                   int first, int last, bool offload);

// For the family predictors. Each sets the parameter, gradient and buffer peaks (on the device and, under offload,
// on the host), the formula, the traffic and, under offload, the bytes of gradients sent down to the host per step,
// and returns what this rank's optimizer updates (its master weights and Adam moments): one (unit or kAllUnits,
// elements) per optimizer buffer it keeps.
using Updated = std::vector<std::pair<int, uint64_t>>;

Updated predict_ddp(const StrategyOptions& options, const AnalyticInput& input,
                    Prediction& prediction);  // ddp-zero too
Updated predict_zero12(const StrategyOptions& options, const AnalyticInput& input, int stage, Prediction& prediction);
Updated predict_zero3(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction);
Updated predict_fsdp(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction);
Updated predict_fsdp2(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction);
Updated predict_pipeline(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction);
// fsdp2 with --pp (fsdp2_pipeline_model.cpp; predict_fsdp2 hands over to it).
Updated predict_fsdp2_pipeline(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction);
// The chunks of blocks stage `stage` of `stages` runs, as pp splits them (pipeline.h balance_stages over the blocks'
// charged parameters, the root's on the first and the last stage; interleaved_chunks with virtual stages).
std::vector<StageBlocks> predicted_stage_chunks(const StrategyOptions& options, const AnalyticInput& input, int stages,
                                                int stage);
// A tensor-parallel stage's activation traffic per step in its "tensor-parallel" group (pipeline_model.cpp's
// formulas): 4 all-reduces of b·s·h per block per micro-batch (6 checkpointed), one more on the first and on the last
// stage, and 3 of b·s fp32 on the last; under sequence parallelism reduce-scatters and all-gathers, the re-gathers,
// and the stage's norm gradients summed once per step: in one fp32 all-reduce (Megatron's, no `per_norm_dtype`) or one
// all-reduce per norm weight at `per_norm_dtype` (FSDP2's at its stage's last backward).
void add_stage_tensor_traffic(Prediction& prediction, const AnalyticInput& input, const Mesh& mesh, uint64_t own_blocks,
                              std::optional<DType> per_norm_dtype = std::nullopt);
// The bytes of one micro-batch's activation between two stages: b·s·h at the compute dtype, each TP rank's 1/T of
// them under sequence parallelism.
uint64_t stage_boundary_bytes(const AnalyticInput& input, const Mesh& mesh);
Updated predict_tensor_parallel(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction);

// Adds `calls` calls of `kind` on a payload of `payload_bytes` within a group of `group_size` ranks named `group`,
// at ring volume; nothing for a group of one rank or no calls.
void add_ring_traffic(Prediction& prediction, coll::CollectiveKind kind, const std::string& group,
                      uint64_t payload_bytes, int group_size, uint64_t calls = 1);
// One unit's (or a stage's root tensors') model states under Megatron-LM's data parallelism, for tp and pp with
// degrees: its parameters and gradients charged whole; without the distributed optimizer its gradients all-reduced
// over the "data-parallel" group and the optimizer updating all `elements`, with it (Megatron's
// --use-distributed-optimizer) reduce-scattered, the parameters all-gathered, the optimizer updating 1/D.
void add_megatron_unit(Prediction& prediction, Updated& updated, const AnalyticInput& input,
                       const optim::PrecisionRecipe& recipe, const Mesh& mesh, bool distributed, int unit,
                       uint64_t elements);
// Tensor parallelism's activation traffic per step within a TP group of `tp` named `group` (tp_model.cpp's
// formulas): the block and root all-reduces of b·s·h (or, under sequence parallelism, reduce-scatters and
// all-gathers, the re-gathers and the norm gradients' all-reduce) and the parallel cross-entropy's three of b·s fp32.
// The norm gradients under sequence parallelism: Megatron's one fp32 all-reduce of all of them per step
// (finalize_model_grads) by default; with `norm_grads_per_backward` FSDP2's, one all-reduce per norm weight in every
// backward at `norm_grad_dtype` (DTensor's Partial gradient redistributed to Replicate, fsdp2.cpp).
void add_tensor_parallel_traffic(Prediction& prediction, const AnalyticInput& input, const std::string& group, int tp,
                                 bool norm_grads_per_backward = false, DType norm_grad_dtype = DType::kF32);
// ZeRO-3 and FSDP over tensor-parallel layers (--tp T, sharded_units.h): the layout of `options` for the input's
// rank, and the group the units are sharded over, "data-parallel" (M = D) with T ≥ 2, else "world". With T ≥ 2 adds
// tp's activation traffic in the "tensor-parallel" group and the gradient norm's all-reduce there (4 bytes).
struct ShardedLayout {
  Mesh mesh;
  std::string group;
};
ShardedLayout sharded_layout(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction);
// `count` elements padded to a multiple of `ranks`, as a sharded flat buffer is.
uint64_t padded_elements(uint64_t count, int ranks);

// Every unit sharded over a group of M ranks (ZeRO-3, FSDP).
struct UnitShards {
  std::vector<uint64_t> padded;       // [units] P_u: n_u padded to a multiple of M
  uint64_t shard_elements = 0;        // Σ_u P_u/M: what this rank keeps of all units
  uint64_t largest_padded_block = 0;  // the largest P_u over the blocks; 0 without blocks
  int largest_block = 0;              // its unit; 0 without blocks
  int group_size = 1;                 // M

  // Σ_u of the bytes charged for unit u's shard of P_u/M elements at `dtype`.
  uint64_t shard_bytes(const AnalyticInput& input, DType dtype) const;
  // The shards as the optimizer keeps them: one per unit.
  Updated updated() const;
};
UnitShards unit_shards(const AnalyticInput& input, int group_size);

}  // namespace emu::strategy
