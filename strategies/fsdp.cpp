// FSDP as PyTorch 2.x runs it (FSDP1: FullyShardedDataParallel with MixedPrecision(param_dtype=bf16), one FSDP
// unit per model unit; torch/distributed/fsdp/_flat_param.py, _runtime_utils.py): each unit's parameters form
// one FlatParameter, padded and cut into equal shards over the shard group, all-gathered (unsharded) before use
// and freed (resharded) after. The shards and collectives are sharded_units.h's; this file is FSDP's policy: the
// sharding strategy and the prefetch.
//
// Sharding strategy (FsdpOptions::sharding), per micro-batch:
//   FULL_SHARD     sharded over the world. A block is gathered for its forward and freed after it, gathered again
//                  for its backward and freed when it ends: two all-gathers and one reduce-scatter per block. The
//                  root unit (embeddings, final norm, head) is not resharded after forward, as FSDP's root is not:
//                  it stays gathered from the start of forward to the end of backward.
//   SHARD_GRAD_OP  as FULL_SHARD, but no unit is freed after forward: each stays gathered until its backward ends
//                  (one all-gather per unit).
//   NO_SHARD       a shard group of one rank: every rank holds whole units, nothing is gathered, and the gradients
//                  are all-reduced over the world (DDP through FSDP).
//   HYBRID_SHARD   FULL_SHARD within a node (the context's intra-node group); the reduce-scattered gradient shards
//                  are then all-reduced across nodes, among the ranks with the same local rank (the inter-node
//                  group).
// In the mixed recipe the sharded flat parameter is fp32 and is the master weight; no bf16 shard is kept between
// uses: each all-gather makes one from it (FlatParamHandle._use_low_precision_shard, the _mp_shard) and frees it
// when the all-gather ends (post_unshard), so for a moment a unit's bf16 shard sits beside its gathered bf16 copy.
// NO_SHARD keeps its bf16 copy, as FSDP1 frees _mp_shard only for sharded strategies. The gradient shards are
// fp32: FSDP reduces in bf16, then keeps the sharded gradient at the dtype of its fp32 sharded parameter.
//
// Gradients (use_orig_params=False, the default; _flat_param.py's views, _runtime_utils.py _post_backward_hook,
// _reduce_grad; sharded_units.h forms_flat_gradient): a block's parameters are views of its FlatParameter, so
// autograd makes each view's gradient when backward reaches the op reading it and holds them until the block's last
// (ln_1's); the views' split backward then concatenates them into the FlatParameter's .grad [n_u], beside them for
// a moment, and they are freed. The root's parts are made as autograd reaches them (the head's and the final norm's
// after the head's backward, the embeddings' at its end, flat.h RootGradientCharges) and concatenated likewise. The
// post-backward hook reduce-scatters that .grad into a new shard-sized tensor at the gradient dtype and frees it
// (its F.pad copy, made when the .grad is not a multiple of N, is not charged: sharded_units.h). A unit's sharded
// gradient is made by its first reduce-scatter of a step (beside the unsharded one, which is freed after; in the
// mixed recipe a cast of the bf16 reduce-scatter output, freed after it) and
// freed after the optimizer step by zero_grad(set_to_none=True). Under CPUOffload the sharded gradients are the
// host's _cpu_grad, kept from set-up.
//
// Prefetch, one unit ahead of use at most:
//   backward_prefetch  BACKWARD_PRE   the next unit in backward is gathered before this unit's gradients are
//                                     computed: two blocks gathered at once
//                      BACKWARD_POST  the next unit is gathered after this unit's gradients are computed and this
//                                     unit freed, before they are reduce-scattered: one block gathered at a time
//                      NONE           each unit is gathered only when its own backward begins
//   forward_prefetch   the next block is gathered when a block's forward begins
// emu's collectives are blocking, so no all-gather is ever queued behind another and FSDP's rate limiter
// (limit_all_gathers) would have nothing to hold back.
//
// Over tensor-parallel layers (--tp T; PyTorch's 2-D recipe: parallelize_module over mesh["tp"], then
// FullyShardedDataParallel(model, device_mesh=mesh["dp"], use_orig_params=True)): each unit's FlatParameter is the
// flat concatenation of the rank's TP slices (the local tensors of its DTensor parameters), sharded over the
// "data-parallel t" group of D = N/T as above (the world reads D); NO_SHARD all-reduces over that group. The
// gradient norm sums over the data-parallel group, then over the TP group, each norm weight once (sharded_units.h).
// HYBRID_SHARD over TP is refused.
#include <memory>
#include <vector>

#include "emu/check.h"
#include "strategies/flat.h"
#include "strategies/sharded_units.h"

namespace emu::strategy {
namespace {

class Fsdp final : public ShardedUnits {
 public:
  using ShardedUnits::ShardedUnits;

 protected:
  // One FlatParameter shard per unit, as a shrunk run charges it (model/shrink.h).
  std::vector<uint64_t> optimizer_tensors() const override {
    std::vector<uint64_t> tensors(static_cast<size_t>(model_.num_units()));
    for (size_t u = 0; u < tensors.size(); ++u) {
      const int unit = static_cast<int>(u);
      tensors[u] = unit_charge(model_, unit).elements(shard_elements(unit));
    }
    return tensors;
  }

  ShardGroups shard_groups() override {
    ShardGroups chosen;  // FULL_SHARD and SHARD_GRAD_OP: the world (over TP the data-parallel group), no replicas
    switch (options_.fsdp.sharding) {
      case Sharding::kFullShard:
      case Sharding::kShardGradOp: chosen.shard = data_parallel(); break;
      case Sharding::kNoShard:
        chosen.alone = true;
        chosen.replicas = data_parallel() != nullptr ? data_parallel() : &world_;
        break;
      case Sharding::kHybridShard:
        if (data_parallel() != nullptr) {
          throw InputError(
              "fsdp-hybrid over --tp is not built (HYBRID_SHARD over a 3-D mesh); accepted: fsdp, "
              "fsdp-grad-op or fsdp-no-shard with --tp");
        }
        if (context_.intra_node == nullptr || context_.inter_node == nullptr) {
          throw InputError("hybrid sharding needs the intra-node and inter-node groups (ranks per node)");
        }
        chosen.shard = context_.intra_node;
        chosen.replicas = context_.inter_node;
        break;
    }
    return chosen;
  }

  bool keeps_parameter_shard() const override { return false; }
  // _reduce_grad: the reduce-scatter output becomes _saved_grad_shard (accumulated into by later micro-batches),
  // FlatParameter.grad at the step (prepare_gradient_for_optim), freed by zero_grad(set_to_none=True).
  bool makes_gradient_shards_in_backward() const override { return true; }
  bool makes_root_gradients_in_parts() const override { return true; }
  // use_orig_params=False: the parameters are views of the FlatParameter, which alone gets a .grad.
  bool forms_flat_gradient() const override { return true; }

  DType gradient_shard_dtype() const override {
    return options_.recipe.has_master ? DType::kF32 : options_.recipe.grads;
  }

  void before_forward(int u) override {
    gather(u, "forward");
    if (u != 0 && options_.fsdp.forward_prefetch) prefetch_next(u, /*forward=*/true);
  }

  void after_forward(int u) override {
    // The root is not resharded after forward; SHARD_GRAD_OP reshards no unit until its backward.
    if (u == 0 || options_.fsdp.sharding == Sharding::kShardGradOp) return;
    release(u);
  }

  void before_backward(int u) override {
    gather(u, "backward");
    begin_gradients(u);
    if (options_.fsdp.backward_prefetch == BackwardPrefetch::kPre) prefetch_next(u, /*forward=*/false);
  }

  void after_backward(int u) override {
    // Autograd makes the FlatParameter's .grad; then _post_backward_hook reshards the unit and, with BACKWARD_POST,
    // gathers the next one (_post_backward_reshard; the root's backward ends the pass: nothing follows it) before it
    // reduce-scatters the gradient.
    form_flat_gradient(u);
    release(u);
    if (options_.fsdp.backward_prefetch == BackwardPrefetch::kPost && u != 0) prefetch_next(u, /*forward=*/false);
    reduce_gradients(u);
  }

 private:
  // Gathers the one unit that follows `u` in this pass, if any.
  void prefetch_next(int u, bool forward) {
    const std::vector<int> next = following_units(u, forward);
    if (!next.empty()) gather(next.front(), forward ? "forward prefetch" : "backward prefetch");
  }
};

}  // namespace

std::unique_ptr<Strategy> make_fsdp(StrategyContext context, const StrategyOptions& options) {
  return std::make_unique<Fsdp>(context, options);
}

}  // namespace emu::strategy
