// ZeRO stage 3 as DeepSpeed runs it: parameters, gradients and optimizer state all partitioned over the world (over
// tensor parallelism, its data-parallel group);
// each unit's parameters all-gathered before use and released after. The partitions and collectives are
// sharded_units.h's; this file is DeepSpeed's policy: when a unit is fetched, prefetched, kept and released.
//
// Per rank and unit, with S_u = ⌈n_u/N⌉: parameter partition [S_u] recipe.params, gradient partition [S_u]
// recipe.grads, master, m, v [S_u]; per rank, the ipg reduce bucket [R] recipe.grads kBuckets for the whole run,
// R = reduce_bucket_size (full scale ÷ k²).
//
// Gathered parameters, at DeepSpeed's grain (zero3_modules.h): DeepSpeed's PartitionedParameterCoordinator fetches
// each sub-module's parameters in its pre-forward and pre-backward hooks, prefetches the next ones in its trace
// (stage3_prefetch_bucket_size, stage3_max_live_parameters) and releases them after use unless persistent
// (stage3_param_persistence_threshold) or used again soon (stage3_max_reuse_distance). emu replays that trace
// tensor by tensor once at set-up and charges, through each stretch of the micro-batch its hooks bound (the
// embeddings' forward, each block's forward, the final norm's and the head's forward with the loss, their
// backward, each block's backward with its recomputation, the embeddings' backward), the most DeepSpeed holds at
// once within it; the first micro-batch after an optimizer step gathers the persistent tensors as it uses them,
// later ones begin with them.
// emu computes a block as one unit: its data is all-gathered whole, uncharged, before its forward and again
// before its backward unless DeepSpeed keeps every tensor of it in between; the root's once per micro-batch, from
// the start of forward to the end of backward. The gradients are reduce-scattered per unit when its backward ends.
// Gradients (stage3.py reduce_partition_and_remove_grads): autograd makes each parameter's .grad as backward
//   reaches it, DeepSpeed copies it into the ipg bucket and drops it, so one .grad is alive at a time. emu
//   computes a unit's gradients into one buffer, held uncharged; what is charged is the unit's largest tensor
//   at the gradients' dtype while its backward runs: the head's from its AccumulateGrad, once the head's backward
//   has run, to the first block's backward (a tied head's none: the final norm's), each block's through its
//   backward, the embedding's through its backward at the end.
// Persistence (stage3_param_persistence_threshold): a tensor of at most that many elements is not released once
//   fetched (a unit of at most that many, its data). The optimizer step changes its partition, so the step frees
//   it and its next use fetches it afresh: one all-gather per step, as DeepSpeed re-gathers persistent parameters
//   after the optimizer step.
// Parameter offload (offload_param device "cpu"): the partitions live in host memory; every fetch copies the
//   unit's partition up over PCIe before its all-gather (stage3.py keeps the bit16 partitions in a flat CPU buffer,
//   partition_parameters.py copies ds_tensor to the device to gather it), also on one rank. After the step the
//   updated partition goes down to its host copy, unless the optimizer is offloaded too and updates it there.
// Over tensor-parallel layers (--tp T, Megatron-DeepSpeed's mpu passed to deepspeed.initialize): the partitions are
// over the data-parallel group of D = N/T (N above reads D), the parameters partitioned are the rank's TP slices,
// and the gradient norm is summed over the data-parallel group, then the model-parallel one, TP duplicates counted
// once (sharded_units.h). DeepSpeed's pipeline engine refuses ZeRO-3, so there is no --pp.
#include <algorithm>
#include <memory>
#include <vector>

#include "strategies/analytic.h"
#include "strategies/flat.h"
#include "strategies/sharded_units.h"
#include "strategies/zero3_modules.h"

namespace emu::strategy {
namespace {

class Zero3 final : public ShardedUnits {
 public:
  using ShardedUnits::ShardedUnits;

  void setup() override {
    ShardedUnits::setup();
    // DeepSpeed makes the ipg bucket with the optimizer (stage3.py _setup_for_real_optimizer, contiguous_gradients)
    // and keeps it all run: reduce_bucket_size elements at the gradients' dtype, one per communication dtype (one
    // here), whatever overlap_comm says and however small the model. emu reduces each unit from its own gradients,
    // so the bucket is charged, not used: one element backs it.
    const size_t elements = options_.scaled(options_.zero.reduce_bucket_elements);
    ipg_bucket_ = device_.allocate(1, options_.recipe.grads, Category::kBuckets, "ZeRO-3 ipg reduce bucket",
                                   elements * dtype_size(options_.recipe.grads));
    for (int u = 0; u < model_.num_units(); ++u) {
      uint64_t largest = 0;
      for (const model::ParamInfo& param : model_.layout(u).params) {
        largest = std::max<uint64_t>(largest, model::tensor_charge(model_.config(), param));
      }
      largest_tensor_.push_back(largest);
    }
    const AnalyticInput input = analytic_input(model_, 1, 1, 1);
    sub_groups_ =
        sub_group_partitions(input.registration_order(), shard_size(), options_.scaled(options_.zero.sub_group_size),
                             static_cast<uint64_t>(input.shrink));
    const Zero3ModuleInput modules = zero3_module_input(options_, input);
    first_ = zero3_module_phases(modules, /*persistent_gathered=*/false);
    later_ = zero3_module_phases(modules, /*persistent_gathered=*/true);
  }

 protected:
  bool keeps_gathered(size_t count) const override {
    return count <= options_.scaled(options_.zero.param_persistence_threshold);
  }
  bool offloads_parameters() const override { return options_.zero.offload_param; }

  // stage3.py step(): the partition one sub-group at a time (_create_fp16_sub_groups, shard.h
  // sub_group_partitions: tensors in registration order until sub_group_size elements of partition).
  // _prepare_sub_group flattens the sub-group's gradient partitions into a new buffer and casts it to fp32 (at fp32
  // the flat copy is the fp32 gradient), the flat copy freed once cast; the fp32 gradient lives through the
  // sub-group's step and _release_sub_group drops it. Under optimizer offload the gradients are already on the host
  // and nothing is made on the device. Both are charged (S_g elements as a shrunk run charges them), not used:
  // AdamW reads each unit's gradient shard itself, once the sub-groups are charged (a step charges nothing else).
  void update(double lr, float grad_scale) override {
    const DType grads = options_.recipe.grads;
    for (const uint64_t held : sub_groups_) {
      Buffer flat, fp32;
      if (context_.offload == nullptr) {
        flat = device_.allocate(1, grads, Category::kGradients, "ZeRO-3 sub-group gradients, flattened",
                                held * dtype_size(grads));
        if (grads != DType::kF32) {
          fp32 = device_.allocate(1, DType::kF32, Category::kGradients, "ZeRO-3 sub-group gradients, fp32",
                                  held * dtype_size(DType::kF32));
          flat.reset();
        }
      }
      // DeepSpeed's FusedAdam makes no temporaries; with torch_adam torch.optim.AdamW steps the sub-group's fp32
      // partition, one flat tensor, and makes --adamw's for as long as the sub-group's step.
      const std::vector<uint64_t> sub_group = {held};
      const optim::StepTemporaries temporaries(
          optimizer_device(), options_.zero.torch_adam ? options_.adamw_impl : optim::AdamWImpl::kFused, sub_group,
          options_.recipe.moments);
    }
    for (int u = 0; u < model_.num_units(); ++u) update_unit(u, lr, grad_scale);
    release_stale_units();
    gathered_.reset();  // the persistent tensors too: the next use gathers them afresh
    persistent_gathered_ = false;
  }

  // The data of every unit is gathered whole for emu's math, uncharged; what is charged is what DeepSpeed holds
  // gathered (zero3_modules.h), set as each stretch of the micro-batch begins: the most it holds at once while the
  // stretch runs.
  void before_forward(int u) override {
    gather(u, "forward");
    charge_gathered(phases().forward[static_cast<size_t>(u)]);
  }

  void after_forward(int u) override {
    if (u == 0) return;  // the root's data stays gathered until its backward ends
    // A block DeepSpeed keeps whole until its backward is not gathered again; otherwise it is, whole.
    if (!phases().kept[static_cast<size_t>(u)]) release(u);
    if (u == model_.num_units() - 1) charge_gathered(phases().head_forward);  // the final norm, the head, the loss
  }

  void before_backward(int u) override {
    if (u == 0) charge_gathered(phases().head_backward);
    if (u == model_.num_units() - 1) grad_.reset();  // the head's backward has ended
    gather(u, "backward");
    if (u != 0) charge_gathered(phases().backward[static_cast<size_t>(u)]);
    begin_gradients(u);
    if (u != 0) make_grad(u);  // the root's once the head's backward makes the first (gradient_made)
  }

  void gradient_made(int u, size_t offset) override {
    if (u == 0) make_grad(0);
    ShardedUnits::gradient_made(u, offset);
  }

  void after_backward(int u) override {
    reduce_gradients(u);
    release(u);
    grad_.reset();
    if (u == 1) {  // the embedding's backward comes next
      charge_gathered(phases().backward[0]);
      make_grad(0, /*root_at_end=*/true);
    }
    if (u == 0) {
      charge_gathered(phases().after);
      persistent_gathered_ = true;
    }
  }

  bool charges_gradients_itself(int /*u*/) const override { return true; }

  bool charges_gathered_itself(int /*u*/) const override { return true; }

 private:
  // The micro-batch's stretches as DeepSpeed runs them: the first after an optimizer step gathers the persistent
  // tensors as it uses them, later ones start with them.
  const Zero3Phases& phases() const { return persistent_gathered_ ? later_ : first_; }

  // Charges `elements` (as charged) of gathered parameters in place of what was charged.
  // Kept as it is when unchanged (block after block in steady state): the caching allocator then sees one buffer
  // held, as it sees DeepSpeed's same-sized tensors freed and made again.
  void charge_gathered(uint64_t elements) {
    if (gathered_.allocated() && elements == gathered_elements_) return;
    gathered_.reset();
    gathered_elements_ = elements;
    if (shard_size() == 1 && !offloads_parameters()) return;  // the partitions are the parameters: nothing gathered
    const DType dtype = options_.recipe.params;
    gathered_ =
        device_.allocate(1, dtype, Category::kParameters, "ZeRO-3 gathered parameters", elements * dtype_size(dtype));
  }

  // Charges the .grad autograd is making in unit `u`'s backward: its largest tensor at the gradients' dtype. The
  // root's at the head are those made there (model/layout.h gradient_made_at_end): a head tied to the embedding
  // makes none, autograd holding its part of the table's gradient until the embedding's backward (model.h).
  void make_grad(int u, bool root_at_end = false) {
    if (grad_.allocated()) return;
    const uint64_t largest =
        u == 0 && !root_at_end ? largest_tensor_charge(model_, 0) : largest_tensor_[static_cast<size_t>(u)];
    const DType dtype = options_.recipe.grads;
    grad_ = device_.allocate(1, dtype, Category::kGradients, "parameter .grad, before the ipg bucket",
                             largest * dtype_size(dtype));
  }

  Buffer ipg_bucket_;  // [reduce_bucket_size ÷ k²] recipe.grads, charged only
  Zero3Phases first_, later_;
  bool persistent_gathered_ = false;      // since the last optimizer step
  Buffer gathered_;                       // what DeepSpeed holds gathered now, one element backing it
  uint64_t gathered_elements_ = 0;        // what gathered_ charges, as charged
  std::vector<uint64_t> largest_tensor_;  // per unit, its largest tensor as charged
  std::vector<uint64_t> sub_groups_;      // step()'s sub-groups in order, partition elements as charged
  Buffer grad_;                           // the .grad being made (make_grad), one element backing it
};

}  // namespace

std::unique_ptr<Strategy> make_zero3(StrategyContext context, const StrategyOptions& options) {
  return std::make_unique<Zero3>(context, options);
}

}  // namespace emu::strategy
