// Tensor parallelism (`tp`) as Megatron-LM runs it (--tensor-model-parallel-size t; core/tensor_parallel/layers.py
// ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding; mappings.py; cross_entropy.py): all ranks of
// the run form one TP group of t = N (data-parallel replicas of the group are not built yet), every rank holds a
// 1/t slice of every matrix and runs the same micro-batches. workloads/model/tensor_parallel.h lists the split:
// q/k/v and gate/up column-parallel (heads and FFN rows split), o and down row-parallel with one all-reduce of
// their [b·s, h] output each in forward (g), one all-reduce of the [b·s, h] gradient of each column-parallel input
// in backward (f), the embedding and the LM head vocabulary-parallel over the padded vocabulary V' (the embedding
// output all-reduced in forward, the head's input gradient in backward) and Megatron's parallel cross-entropy
// (three all-reduces of [b·s] fp32: max, target logit, Σexp). A tied head is the rank's own embedding slice, as
// Megatron ties them without pipeline stages. Per micro-batch: 4L + 2 all-reduces of b·s·h at the compute dtype
// (2L + 1 in forward, 2L + 1 in backward; an activation-checkpointed block runs its 2 forward ones again) plus 3 of
// b·s fp32, each moving 2(t − 1)/t of its payload per rank on a ring.
//
// Norm weights are replicated: every rank normalises the same all-reduced hidden state, so their gradients come
// out identical on every rank without a reduction (Megatron all-reduces them only under sequence parallelism); the
// gradient norm counts them once (rank 0), as Megatron's clip_grad_norm skips tensor-parallel duplicates. GPT-2's
// replicated tensors are its LayerNorms, its row-parallel c_proj biases (added after the all-reduce) and wpe: every
// tensor whose slice is the whole tensor.
//
// Memory per rank, the recipe of Megatron-LM's mixed-precision optimizer with its distributed optimizer off
// (--bf16, no --use-distributed-optimizer: optimizer/optimizer.py Float16OptimizerWithFloat16Params and the DDP
// grad buffer's main_grad): bf16 parameters (2), fp32 main gradients (4), fp32 master weights (4) and Adam m, v
// (4 + 4): 18 bytes per local parameter, Ψ/t of them (plus the vocabulary padding's rows). In the fp32 recipe
// 4 + 4 + 8 = 16. Activations are the slice's: the model runs with a/t heads, F/t and V'/t (memory_terms.h), while
// the norms' inputs and outputs and the residual stream stay whole [b·s, h] on every rank (no sequence parallelism).
//
// Sequence parallelism (--sequence-parallel, ModelOptions::sequence_parallel; the model's side in
// workloads/model/tensor_parallel.h): each of the all-reduces above becomes a reduce-scatter and an all-gather of
// the same [b·s, h] (the same (t − 1)/t + (t − 1)/t of the payload on a ring), and the saved sequence-parallel inputs
// of q/k/v, gate/up and the head are all-gathered once more in backward for their weight gradients (2L + 1 more
// all-gathers per micro-batch, as Megatron's LinearWithGradAccumulationAndAsyncCommunication does). The norm weights'
// gradients then cover each rank's rows only: after the last micro-batch they are all-reduced over the group in
// one call, in fp32 (Megatron's main_grad; finalize_model_grads all-reduces the sequence_parallel parameters).
//
// With --tp T < N the world is D = N/T tensor-parallel groups of T consecutive ranks (Megatron's layout,
// strategy.h ParallelOptions), each a data-parallel replica of the model training on its own slice of the global
// batch (replica d's micro-batch m holds samples (m·D + d)·b …, data::sample_offset over D). The TP all-reduces
// run in the replica's "tensor-parallel d" group; after backward each unit's gradients (its main_grad buffer) are
// all-reduced and averaged over the "data-parallel t" group of the ranks holding the same slice, as Megatron-LM's
// DistributedDataParallel reduces its grad buffer (core/distributed/distributed_data_parallel.py, param_and_grad_
// buffer.py: without --overlap-grad-reduce one reduction per bucket after backward; emu's buckets are the units).
// That moves 2(D − 1)/D of the local gradients per rank per step. The gradient norm is summed over the TP group
// only (the replicas' gradients are then equal, so summing over them would count each D times, as Megatron's
// clip_grad_norm sums over the model-parallel group only).
//
// With --distributed-optimizer (Megatron's --use-distributed-optimizer, core/optimizer/distrib_optimizer.py: ZeRO-1
// over the data-parallel group) each unit's fp32 master weights and Adam moments are sharded over the D replicas
// (rank d of the group owns elements [d·⌈n/D⌉, (d+1)·⌈n/D⌉) of the unit's n, strategies/shard.h); the gradients
// are reduce-scattered (averaged) instead of all-reduced, each rank steps its shard, and the updated bf16
// parameters are all-gathered: 6 + 12/D bytes per local parameter in the mixed recipe instead of 18. The gradient
// norm is then summed over the world: the shards of the D replicas and the slices of the T ranks, each element once.
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "emu/check.h"
#include "strategies/flat.h"
#include "strategies/shard.h"
#include "strategies/strategy.h"
#include "workloads/model/tensor_parallel.h"
#include "workloads/optim/adamw_state.h"

namespace emu::strategy {
namespace {

class TensorParallelStrategy final : public Strategy {
 public:
  using Strategy::Strategy;

  void setup() override {
    const Mesh mesh = mesh_of(options_, world_.size(), world_.rank());
    EMU_CHECK(mesh.pipeline == 1, "tp with pipeline stages: {} (TP x PP is not built)", mesh.pipeline);
    if (mesh.data > 1) {
      tp_group_ = split_group(mesh.data_rank(), mesh.tensor_rank(), mesh.tensor,
                              fmt::format("tensor-parallel {}", mesh.data_rank()));
      dp_group_ = split_group(mesh.tensor_rank(), mesh.data_rank(), mesh.data,
                              fmt::format("data-parallel {}", mesh.tensor_rank()));
    }
    tensor_ = std::make_unique<GroupTensorParallel>(tp());
    model_.set_tensor_parallel(tensor_.get());
    units_.resize(static_cast<size_t>(model_.num_units()));
    index_.resize(units_.size());
    for (int u = 0; u < model_.num_units(); ++u) hold(u);
  }

  // The whole unit in its full layout: each rank places its slice; replicated tensors come from rank 0.
  std::vector<float> full_weights(int unit) override {
    std::vector<float> out(model_.full_layout(unit).count, 0.0f);
    std::vector<float> mine(model_.layout(unit).count);
    fp32_values(unit, mine.data());
    place_tp_slice(model_, unit, index_[static_cast<size_t>(unit)], mine.data(), tp().rank() == 0, out.data());
    tp().all_reduce(out.data(), out.data(), out.size(), DType::kF32, coll::ReduceOp::kSum, "full weights");
    return out;
  }

  std::vector<coll::Communicator*> groups() override {
    std::vector<coll::Communicator*> out{&world_};
    if (tp_group_) out.push_back(tp_group_.get());
    if (dp_group_) out.push_back(dp_group_.get());
    return out;
  }

 protected:
  // Sequence parallelism: the replicated norm weights' gradients, each rank's over its own rows, summed over the TP
  // group, before the data-parallel reduction (Megatron's finalize_model_grads reduces them after it: the same sums,
  // and here every rank's whole norm gradient is valid when the distributed optimizer then reduce-scatters it).
  void reduce_sequence_parallel_norms() {
    if (!model_.options().sequence_parallel || tp().size() == 1) return;
    std::vector<float> sums;
    for_each_replicated([&](const Held& held, const model::ParamInfo& param) {
      const size_t at = sums.size();
      sums.resize(at + param.count);
      if (device_.holds_data()) {
        convert(element(held.grads.data(), held.grads.dtype(), param.offset), held.grads.dtype(), sums.data() + at,
                DType::kF32, param.count);
      }
    });
    tp().all_reduce(device_.holds_data() ? sums.data() : nullptr, device_.holds_data() ? sums.data() : nullptr,
                    sums.size(), DType::kF32, coll::ReduceOp::kSum, "tp all-reduce, sequence-parallel norm gradients");
    if (!device_.holds_data()) return;
    size_t at = 0;
    for_each_replicated([&](Held& held, const model::ParamInfo& param) {
      convert(sums.data() + at, DType::kF32, element(held.grads.data(), held.grads.dtype(), param.offset),
              held.grads.dtype(), param.count);
      at += param.count;
    });
  }

  double gradient_sum_of_squares() override {
    double sum = 0;
    for (int u = 0; u < model_.num_units(); ++u) {
      const Held& held = units_[static_cast<size_t>(u)];
      const model::UnitLayout& layout = model_.layout(u);
      const DType dtype = held.grads.dtype();
      for (size_t p = 0; p < layout.params.size(); ++p) {
        if (replicated(u, p) && tp().rank() != 0) continue;  // counted once
        size_t lo = layout.params[p].offset, hi = lo + layout.params[p].count;
        if (distributed()) held.shard.intersect(lo, hi, lo, hi);  // the shard this rank holds reduced
        sum +=
            optim::grad_sum_of_squares(optim::ConstElementSpan(element(held.grads.data(), dtype, lo), hi - lo, dtype));
      }
    }
    return distributed() ? sum_over_world(sum, "gradient norm") : sum_over(tp(), sum, "gradient norm");
  }

  // Data parallelism: each unit's gradients averaged over the replicas (reduce-scattered to their owners under the
  // distributed optimizer).
  void finish_gradients() override {
    reduce_sequence_parallel_norms();
    if (!dp_group_) return;
    for (Held& held : units_) {
      if (!distributed()) {
        dp_group_->all_reduce(held.grads.data(), held.grads.data(), held.grads.count(), held.grads.dtype(),
                              coll::ReduceOp::kAvg, "data-parallel gradient all-reduce");
        continue;
      }
      const std::vector<size_t> counts = shard_counts(held.grads.count());
      dp_group_->reduce_scatter_v(held.grads.data(), element(held.grads.data(), held.grads.dtype(), held.shard.offset),
                                  counts, held.grads.dtype(), coll::ReduceOp::kAvg,
                                  "data-parallel gradient reduce-scatter");
    }
  }

  void update(double lr, float grad_scale) override {
    for (Held& held : units_) {
      if (!distributed()) {
        held.optimizer->step(options_.adamw, optim::ElementSpan::of(held.params),
                             optim::ConstElementSpan::of(held.grads), 0, held.decay, lr, grad_scale);
      } else {
        const ShardInfo& shard = held.shard;
        const DType params = held.params.dtype(), grads = held.grads.dtype();
        held.optimizer->step(
            options_.adamw, optim::ElementSpan(element(held.params.data(), params, shard.offset), shard.valid, params),
            optim::ConstElementSpan(element(held.grads.data(), grads, shard.offset), shard.valid, grads), shard.offset,
            held.decay, lr, grad_scale);
        const std::vector<size_t> counts = shard_counts(held.params.count());
        dp_group_->all_gather_v(element(held.params.data(), params, shard.offset), held.params.data(), counts, params,
                                "data-parallel parameter all-gather");
      }
      zero(held.grads.data(), held.grads.dtype(), held.grads.count());
    }
  }

 private:
  struct Held {  // one unit's slice of model states on this rank
    Buffer params, grads;
    ShardInfo
        shard;  // the elements whose optimizer state this rank holds: all of them but under --distributed-optimizer
    std::unique_ptr<optim::AdamWState> optimizer;
    std::vector<optim::DecayRange> decay;
  };

  // Calls f(held, param) for every replicated tensor of every unit, in order.
  template <typename F>
  void for_each_replicated(F&& f) {
    for (int u = 0; u < model_.num_units(); ++u) {
      for (size_t p = 0; p < model_.layout(u).params.size(); ++p) {
        if (replicated(u, p)) f(units_[static_cast<size_t>(u)], model_.layout(u).params[p]);
      }
    }
  }

  bool distributed() const { return dp_group_ != nullptr && options_.parallel.distributed_optimizer; }
  // Each data-parallel rank's real elements of `count` (shard.h): the blocks of the reduce-scatter and all-gather.
  std::vector<size_t> shard_counts(size_t count) const { return strategy::shard_counts(count, dp_group_->size()); }

  // The TP group: the world when every rank is one (no data parallelism).
  coll::Communicator& tp() const { return tp_group_ ? *tp_group_ : world_; }

  // A tensor every rank holds whole (the norm weights): its slice is the full tensor.
  bool replicated(int unit, size_t param) const { return tp().size() > 1 && tp_replicated(model_, unit, param); }

  // Allocates unit `unit`'s slice of parameters, gradients and optimizer state and sets it to the slice of the
  // full model's initial values (vocabulary padding rows start at 0).
  void hold(int unit) {
    const optim::PrecisionRecipe& recipe = options_.recipe;
    const model::UnitLayout& layout = model_.layout(unit);
    // Where each element of the slice lies in the full tensor; not kept by a plan (shapes only, no values).
    std::vector<std::vector<int64_t>>& index = index_[static_cast<size_t>(unit)];
    if (device_.holds_data()) index = tp_slice_index(model_, unit, tp().rank(), tp().size());
    const model::ParameterCharge charge = unit_charge(model_, unit);
    Held& held = units_[static_cast<size_t>(unit)];
    const std::string name = fmt::format("tp rank {}, {}", world_.rank(), layout.name);
    held.params = model::allocate_parameter_space(device_, charge, layout.count, recipe.params, Category::kParameters,
                                                  name + " parameters");
    held.grads = model::allocate_parameter_space(device_, charge, layout.count, recipe.grads, Category::kGradients,
                                                 name + " gradients");
    zero(held.grads.data(), recipe.grads, layout.count);
    held.shard =
        distributed() ? shard_of(layout.count, dp_group_->rank(), dp_group_->size()) : shard_of(layout.count, 0, 1);
    const model::ParameterCharge shard_charge{
        held.shard.valid, charge.charged * static_cast<double>(held.shard.valid) / static_cast<double>(layout.count)};
    held.optimizer = std::make_unique<optim::AdamWState>(optimizer_device(), recipe, held.shard.valid, name,
                                                         distributed() ? shard_charge : charge);
    held.decay = decay_ranges(layout, 0);
    if (device_.holds_data()) {
      std::vector<float> initial(layout.count);
      init_tp_slice(model_, unit, options_.seed, index, initial.data());
      convert(initial.data(), DType::kF32, held.params.data(), recipe.params, layout.count);
      held.optimizer->load_master(
          optim::ConstElementSpan(initial.data() + held.shard.offset, held.shard.valid, DType::kF32));
    }
    model_.bind_weights(unit, held.params.data(), recipe.params);
    model_.bind_grads(unit, held.grads.data(), recipe.grads);
  }

  // The unit's fp32 slice: its master weights when the recipe keeps them, else its parameters.
  void fp32_values(int unit, float* out) {
    const Held& held = units_[static_cast<size_t>(unit)];
    const optim::ElementSpan master = held.optimizer->master();
    if (!master.empty() && distributed()) {  // the data-parallel group's shards of the master weights
      std::vector<float> mine(master.size());
      convert(master.data(), master.dtype(), mine.data(), DType::kF32, master.size());
      const std::vector<size_t> counts = shard_counts(held.params.count());
      dp_group_->all_gather_v(mine.data(), out, counts, DType::kF32, "full weights");
    } else if (!master.empty()) {
      convert(master.data(), master.dtype(), out, DType::kF32, master.size());
    } else {
      convert(held.params.data(), held.params.dtype(), out, DType::kF32, held.params.count());
    }
  }

  std::unique_ptr<coll::Communicator> tp_group_, dp_group_;  // with D > 1 replicas (setup)
  std::unique_ptr<GroupTensorParallel> tensor_;              // the model's view of the TP group (setup)
  std::vector<Held> units_;                                  // [units]
  std::vector<std::vector<std::vector<int64_t>>> index_;  // [units][params][local elements]: the full element or −1
};

}  // namespace

std::unique_ptr<Strategy> make_tensor_parallel(StrategyContext context, const StrategyOptions& options) {
  return std::make_unique<TensorParallelStrategy>(context, options);
}

}  // namespace emu::strategy
