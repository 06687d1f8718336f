// ZeRO stage 3 as DeepSpeed runs it: parameters, gradients and optimizer state all partitioned over the world (over
// tensor parallelism, its data-parallel group);
// each unit's parameters all-gathered before use and released after. The partitions and collectives are
// sharded_units.h's; this file is DeepSpeed's policy: when a unit is fetched, prefetched, kept and released.
//
// Per rank and unit, with S_u = ⌈n_u/N⌉: parameter partition [S_u] recipe.params, gradient partition [S_u]
// recipe.grads, master, m, v [S_u]; per rank, the ipg reduce bucket [R] recipe.grads kBuckets for the whole run,
// R = reduce_bucket_size (full scale ÷ k²).
//
// Per micro-batch:
//   blocks  fetched before their forward and released after it, unless kept for reuse (below); fetched again
//           before their backward (unless kept), their gradients reduce-scattered (averaged) to the owners and the
//           block released when its backward ends: two all-gathers (one when kept) and one reduce-scatter per block.
//   root    emu's root unit (embeddings, final norm, head) encloses every block's forward and backward, so it is
//           fetched once when forward begins and released when backward ends.
// Prefetch (stage3_prefetch_bucket_size): whenever a unit is fetched for use (every block in forward, every unit
//   in backward), the units that follow it in the pass are fetched too, nearest first, while their elements fit
//   in the prefetch bucket and the gathered elements stay within stage3_max_live_parameters. Several units can
//   be gathered ahead of use at once.
// Reuse (stage3_max_reuse_distance): DeepSpeed's coordinator, once it has traced a step (from the second step on),
//   releases a module's parameters after its forward only if they are not used again within max_reuse_distance
//   elements of the trace (partitioned_param_coordinator.py __params_to_release). emu decides per block, at the
//   end of its forward: the block stays gathered until its backward when its reuse distance (analytic.h
//   reuse_distance: the blocks after it and the head, forward and backward) is below the limit. That is the
//   distance of the block's last module (down_proj, also the first its backward uses); the block's earlier
//   modules are up to 2·n_u further, so near the limit DeepSpeed keeps part of a block where emu keeps all of it.
//   emu computes a block as one unit, so it keeps or releases whole blocks; the root is gathered throughout.
// Gradients (stage3.py reduce_partition_and_remove_grads): autograd makes each parameter's .grad as backward
//   reaches it, DeepSpeed copies it into the ipg bucket and drops it, so one .grad is alive at a time. emu
//   computes a unit's gradients into one buffer, held uncharged; what is charged is the unit's largest tensor
//   at the gradients' dtype while its backward runs: the head's from the start of backward to the end of the
//   head's backward (a tied head's none: the final norm's), each block's through its backward, the embedding's
//   through its backward at the end.
// Persistence (stage3_param_persistence_threshold): a unit of at most that many elements is not released once
//   fetched. The optimizer step changes its partition, so the step frees it and its next use fetches it afresh:
//   one all-gather per step, as DeepSpeed re-gathers persistent parameters after the optimizer step.
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
#include <string_view>
#include <vector>

#include "strategies/analytic.h"
#include "strategies/flat.h"
#include "strategies/sharded_units.h"

namespace emu::strategy {
namespace {

constexpr std::string_view kEmbedding = "root gathered embedding";
constexpr std::string_view kHead = "root gathered final norm and head";

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
      unit_elements_.push_back(unit_charge(model_, u).elements(model_.layout(u).count));
      uint64_t largest = 0;
      for (const model::ParamInfo& param : model_.layout(u).params) {
        largest = std::max<uint64_t>(largest, model::tensor_charge(model_.config(), param));
      }
      largest_tensor_.push_back(largest);
    }
    head_ = head_elements(model_);
    root_split_ = root_split(unit_charge(model_, 0).elements(padded_count(0)), embedding_elements(model_));
    split_root_ =
        root_split_.embedding > 0 && !keeps_gathered(unit_elements_[0]) && (shard_size() > 1 || offloads_parameters());
  }

 protected:
  bool keeps_gathered(size_t count) const override {
    return count <= options_.scaled(options_.zero.param_persistence_threshold);
  }
  bool offloads_parameters() const override { return options_.zero.offload_param; }

  // stage3.py step(): the partition one sub-group at a time (_create_fp16_sub_groups closes a sub-group once it
  // holds sub_group_size elements; emu's at unit boundaries). _prepare_sub_group flattens the sub-group's gradient
  // partitions into a new buffer and casts it to fp32 (at fp32 the flat copy is the fp32 gradient), the flat copy
  // freed once cast; the fp32 gradient lives through the sub-group's step and _release_sub_group drops it. Under
  // optimizer offload the gradients are already on the host and nothing is made on the device. Both are charged
  // (S_g elements as a shrunk run charges them), not used: AdamW reads the gradient shards themselves.
  void update(double lr, float grad_scale) override {
    const int units = model_.num_units();
    const size_t limit = options_.scaled(options_.zero.sub_group_size);
    const DType grads = options_.recipe.grads;
    for (int first = 0; first < units;) {
      size_t held = 0;
      int end = first;
      while (end < units && (end == first || held < limit)) {
        held += unit_charge(model_, end).elements(shard_elements(end));
        ++end;
      }
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
      for (int u = first; u < end; ++u) update_unit(u, lr, grad_scale);
      first = end;
    }
    release_stale_units();
  }

  void before_forward(int u) override {
    if (u == 0) {
      gather(0, "forward");
      hold(embedding_, root_split_.embedding, kEmbedding);  // the embedding's forward comes first
      return;
    }
    // The embedding's forward has ended: released unless it is used again within the reuse distance.
    if (u == 1 && reuse_distance(unit_elements_, head_, 0) >= max_reuse()) embedding_.reset();
    gather(u, "forward");
    prefetch(u, /*forward=*/true);
  }

  void after_forward(int u) override {
    if (u == 0) return;  // the root's data stays gathered until its backward ends
    if (reuse_distance(unit_elements_, head_, u) >= max_reuse()) release(u);
    if (u == model_.num_units() - 1)
      hold(head_part_, root_split_.head, kHead);  // the final norm and the head come next
  }

  void before_backward(int u) override {
    if (u == model_.num_units() - 1) {  // the head's backward has ended
      head_part_.reset();
      grad_.reset();
    }
    gather(u, "backward");
    begin_gradients(u);
    make_grad(u);
    prefetch(u, /*forward=*/false);
  }

  void after_backward(int u) override {
    reduce_gradients(u);
    release(u);
    grad_.reset();
    if (u == 1) {  // the embedding's backward comes next
      hold(embedding_, root_split_.embedding, kEmbedding);
      make_grad(0, /*root_at_end=*/true);
    }
    if (u == 0) embedding_.reset();
  }

  bool charges_gradients_itself(int /*u*/) const override { return true; }

  bool charges_gathered_itself(int u) const override { return u == 0 && split_root_; }

 private:
  // Fetches the units that follow `u` in this pass while they fit in the prefetch bucket and under the
  // live-parameter limit; units already gathered (persistent, or prefetched earlier) are passed over.
  void prefetch(int u, bool forward) {
    const size_t bucket = options_.scaled(options_.zero.prefetch_bucket_elements);
    const size_t max_live = options_.scaled(options_.zero.max_live_parameters);
    size_t fetched = 0;
    for (int next : following_units(u, forward)) {
      const size_t count = unit_charge(model_, next).elements(padded_count(next));  // as at full scale, ÷ k²
      if (is_gathered(next)) continue;
      if (fetched + count > bucket || gathered_elements() + root_parts_held() + count > max_live) break;
      gather(next, forward ? "forward prefetch" : "backward prefetch");
      fetched += count;
    }
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

  uint64_t max_reuse() const { return options_.scaled(options_.zero.max_reuse_distance); }

  // Charges a root part of `elements` (as charged) while the root is split, once.
  void hold(Buffer& part, uint64_t elements, std::string_view what) {
    if (!split_root_ || part.allocated()) return;
    const DType dtype = options_.recipe.params;
    part = device_.allocate(1, dtype, Category::kParameters, what, elements * dtype_size(dtype));
  }
  // Elements of the root parts held now, as charged.
  uint64_t root_parts_held() const {
    return (embedding_.allocated() ? root_split_.embedding : 0) + (head_part_.allocated() ? root_split_.head : 0);
  }

  Buffer ipg_bucket_;                    // [reduce_bucket_size ÷ k²] recipe.grads, charged only
  std::vector<uint64_t> unit_elements_;  // n_u as charged, for reuse distances
  uint64_t head_ = 0;                    // the head's elements as charged (head_elements)
  // The root charged per module (split_root_): its gathered data uncharged, the embedding and the final norm with
  // the head each charged while DeepSpeed holds them gathered, one element backing each.
  bool split_root_ = false;
  RootSplit root_split_;
  Buffer embedding_, head_part_;
  std::vector<uint64_t> largest_tensor_;  // per unit, its largest tensor as charged
  Buffer grad_;                           // the .grad being made (make_grad), one element backing it
};

}  // namespace

std::unique_ptr<Strategy> make_zero3(StrategyContext context, const StrategyOptions& options) {
  return std::make_unique<Zero3>(context, options);
}

}  // namespace emu::strategy
