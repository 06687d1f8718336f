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
// gradient norm counts them once (rank 0), as Megatron's clip_grad_norm skips tensor-parallel duplicates.
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
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "emu/check.h"
#include "strategies/flat.h"
#include "strategies/strategy.h"
#include "workloads/model/tensor_parallel.h"
#include "workloads/optim/adamw_state.h"

namespace emu::strategy {
namespace {

class TensorParallelStrategy final : public Strategy, private model::TensorParallel {
 public:
  using Strategy::Strategy;

  void setup() override {
    model_.set_tensor_parallel(this);
    units_.resize(static_cast<size_t>(model_.num_units()));
    index_.resize(units_.size());
    for (int u = 0; u < model_.num_units(); ++u) hold(u);
  }

  // The whole unit in its full layout: each rank places its slice; replicated tensors come from rank 0.
  std::vector<float> full_weights(int unit) override {
    const model::UnitLayout& full = model_.full_layout(unit);
    const model::UnitLayout& local = model_.layout(unit);
    std::vector<float> out(full.count, 0.0f);
    std::vector<float> mine(local.count);
    fp32_values(unit, mine.data());
    for (size_t p = 0; p < local.params.size(); ++p) {
      if (replicated(unit, p) && world_.rank() != 0) continue;
      const std::vector<int64_t>& index = index_[static_cast<size_t>(unit)][p];
      for (size_t i = 0; i < index.size(); ++i) {
        if (index[i] >= 0)
          out[full.params[p].offset + static_cast<size_t>(index[i])] = mine[local.params[p].offset + i];
      }
    }
    world_.all_reduce(out.data(), out.data(), out.size(), DType::kF32, coll::ReduceOp::kSum, "full weights");
    return out;
  }

  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }
  void all_reduce(Buffer& buffer, std::string_view what) override {
    world_.all_reduce(buffer.data(), buffer.data(), buffer.count(), buffer.dtype(), coll::ReduceOp::kSum, what);
  }
  void all_reduce_rows(float* values, size_t count, bool max, std::string_view what) override {
    world_.all_reduce(values, values, count, DType::kF32, max ? coll::ReduceOp::kMax : coll::ReduceOp::kSum, what);
  }
  void reduce_scatter(const Buffer& full, Buffer& slice, std::string_view what) override {
    world_.reduce_scatter(full.data(), slice.data(), slice.count(), slice.dtype(), coll::ReduceOp::kSum, what);
  }
  void all_gather(const Buffer& slice, Buffer& full, std::string_view what) override {
    world_.all_gather(slice.data(), full.data(), slice.count(), slice.dtype(), what);
  }

 protected:
  // Sequence parallelism: the replicated norm weights' gradients, each rank's over its own rows, summed.
  void finish_gradients() override {
    if (!model_.options().sequence_parallel || world_.size() == 1) return;
    std::vector<float> sums;
    for_each_replicated([&](const Held& held, const model::ParamInfo& param) {
      const size_t at = sums.size();
      sums.resize(at + param.count);
      if (device_.holds_data()) {
        convert(element(held.grads.data(), held.grads.dtype(), param.offset), held.grads.dtype(), sums.data() + at,
                DType::kF32, param.count);
      }
    });
    world_.all_reduce(device_.holds_data() ? sums.data() : nullptr, device_.holds_data() ? sums.data() : nullptr,
                      sums.size(), DType::kF32, coll::ReduceOp::kSum,
                      "tp all-reduce, sequence-parallel norm gradients");
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
        if (replicated(u, p) && world_.rank() != 0) continue;  // counted once
        sum += optim::grad_sum_of_squares(optim::ConstElementSpan(
            element(held.grads.data(), dtype, layout.params[p].offset), layout.params[p].count, dtype));
      }
    }
    return sum_over_world(sum, "gradient norm");
  }

  void update(double lr, float grad_scale) override {
    for (Held& held : units_) {
      held.optimizer->step(options_.adamw, optim::ElementSpan::of(held.params), optim::ConstElementSpan::of(held.grads),
                           0, held.decay, lr, grad_scale);
      zero(held.grads.data(), held.grads.dtype(), held.grads.count());
    }
  }

 private:
  struct Held {  // one unit's slice of model states on this rank
    Buffer params, grads;
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

  // A tensor every rank holds whole (the norm weights): its slice is the full tensor.
  bool replicated(int unit, size_t param) const {
    return world_.size() > 1 && model_.layout(unit).params[param].count == model_.full_layout(unit).params[param].count;
  }

  // Allocates unit `unit`'s slice of parameters, gradients and optimizer state and sets it to the slice of the
  // full model's initial values (vocabulary padding rows start at 0).
  void hold(int unit) {
    const optim::PrecisionRecipe& recipe = options_.recipe;
    const model::UnitLayout& layout = model_.layout(unit);
    const model::UnitLayout& full = model_.full_layout(unit);
    // Where each element of the slice lies in the full tensor; not kept by a plan (shapes only, no values).
    std::vector<std::vector<int64_t>>& index = index_[static_cast<size_t>(unit)];
    for (size_t p = 0; p < layout.params.size() && device_.holds_data(); ++p) {
      index.push_back(model::tensor_parallel_index(model_.full_config(), full.params[p], layout.params[p],
                                                   world_.rank(), world_.size()));
    }
    const model::ParameterCharge charge = unit_charge(model_, unit);
    Held& held = units_[static_cast<size_t>(unit)];
    const std::string name = fmt::format("tp rank {}, {}", world_.rank(), layout.name);
    held.params = model::allocate_parameter_space(device_, charge, layout.count, recipe.params, Category::kParameters,
                                                  name + " parameters");
    held.grads = model::allocate_parameter_space(device_, charge, layout.count, recipe.grads, Category::kGradients,
                                                 name + " gradients");
    zero(held.grads.data(), recipe.grads, layout.count);
    held.optimizer = std::make_unique<optim::AdamWState>(optimizer_device(), recipe, layout.count, name, charge);
    held.decay = decay_ranges(layout, 0);
    if (device_.holds_data()) {
      std::vector<float> values(full.count), initial(layout.count, 0.0f);
      model_.init_unit(unit, options_.seed, values.data());
      for (size_t p = 0; p < layout.params.size(); ++p) {
        for (size_t i = 0; i < index[p].size(); ++i) {
          if (index[p][i] >= 0) {
            initial[layout.params[p].offset + i] = values[full.params[p].offset + static_cast<size_t>(index[p][i])];
          }
        }
      }
      convert(initial.data(), DType::kF32, held.params.data(), recipe.params, layout.count);
      held.optimizer->load_master(optim::ConstElementSpan(initial.data(), layout.count, DType::kF32));
    }
    model_.bind_weights(unit, held.params.data(), recipe.params);
    model_.bind_grads(unit, held.grads.data(), recipe.grads);
  }

  // The unit's fp32 slice: its master weights when the recipe keeps them, else its parameters.
  void fp32_values(int unit, float* out) {
    const Held& held = units_[static_cast<size_t>(unit)];
    const optim::ElementSpan master = held.optimizer->master();
    if (!master.empty()) {
      convert(master.data(), master.dtype(), out, DType::kF32, master.size());
    } else {
      convert(held.params.data(), held.params.dtype(), out, DType::kF32, held.params.count());
    }
  }

  std::vector<Held> units_;                               // [units]
  std::vector<std::vector<std::vector<int64_t>>> index_;  // [units][params][local elements]: the full element or −1
};

}  // namespace

std::unique_ptr<Strategy> make_tensor_parallel(StrategyContext context, const StrategyOptions& options) {
  return std::make_unique<TensorParallelStrategy>(context, options);
}

}  // namespace emu::strategy
