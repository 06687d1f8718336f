// The machinery ZeRO-3 (zero3.cpp) and FSDP (fsdp.cpp) share: every unit's flat buffer sharded over a shard group,
// gathered for use and freed after, its gradients reduce-scattered back onto the shards. When each unit is
// gathered and freed, and over which groups, is each framework's policy, in its own file; this class only does
// what the policy asks.
//
// Each unit's flat buffer of n_u elements is padded to a multiple of the shard group's size M and cut into M
// shards of S_u elements (shard.h). Per rank and unit, persistently:
//   parameter shard  [S_u] recipe.params           kParameters, unless the policy keeps none (FSDP1's mixed
//                                                  precision: the fp32 master shard is the flat parameter); in
//                                                  host memory when the policy offloads parameters (ZeRO-3's
//                                                  offload_param), copied up over PCIe before each all-gather
//   gradient shard   [S_u] gradient_shard_dtype()  kGradients; in host memory under optimizer offload (DeepSpeed
//                                                  ZeRO-3's grad partitions on the CPU, FSDP1 CPUOffload's _cpu_grad);
//                                                  on the device, when the policy says so, made by the unit's first
//                                                  reduce-scatter and freed after the optimizer step
//   master, m, v     [S_u]                         kMasterWeights / kOptimizerState (optim/adamw_state.h)
// and while a unit is in use:
//   gathered         [M·S_u] recipe.params  kParameters: all-gathered before use (gather), freed after (release)
//   low-precision    [S_u] recipe.params    kParameters: without a kept parameter shard, made from the master shard
//   shard                                   for each all-gather and freed when it ends (FSDP1's _mp_shard)
//   unit gradients   [M·S_u] recipe.grads   kGradients: made in backward (begin_gradients; the root's in the parts
//                                           autograd makes, when the policy says so; a block's tensor by tensor
//                                           then concatenated, when the policy forms FSDP1's flat gradient),
//                                           reduce-scattered (averaged) over the shard group, all-reduced across the
//                                           replica group when there is one, added to the gradient shard and freed
//                                           (reduce_gradients)
// emu's collectives are blocking: a prefetch shows in memory (a unit gathered before its use), not in overlap.
//
// Over tensor-parallel layers (--tp T; PyTorch's 2-D recipe, parallelize_module over the "tp" mesh dimension then
// FullyShardedDataParallel over "dp" with use_orig_params=True; DeepSpeed ZeRO-3 given Megatron's mpu): the world is
// D = N/T replicas of T consecutive ranks (strategy.h Mesh), the model runs the rank's TP slice with tp's activation
// all-reduces in the "tensor-parallel d" group (Strategy::split_tensor_group), and everything above is that slice: n_u
// is the unit's local elements (the flat concatenation of its TP slices), the shard group the "data-parallel t" group
// of D (M = D). Each rank's slice starts at its part of the full unit's seeded initialisation. The gradient norm sums
// over the shard group, then over the TP group (DeepSpeed's get_grad_norm_direct: the data-parallel all-reduce, then
// _model_parallel_all_reduce), the tensors every TP rank holds whole (norm weights) counted on TP rank 0 only
// (is_model_parallel_parameter or model_parallel_rank == 0).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include "strategies/flat.h"
#include "strategies/shard.h"
#include "strategies/strategy.h"
#include "workloads/optim/adamw_state.h"

namespace emu::strategy {

class ShardedUnits : public Strategy {
 public:
  using Strategy::Strategy;

  void setup() override;
  std::vector<float> full_weights(int unit) override;
  std::vector<coll::Communicator*> groups() override;

 protected:
  // The ranks a unit is sharded over, and those holding the same shard in other shard groups.
  struct ShardGroups {
    bool alone = false;                      // a shard group of this rank alone: nothing to gather or scatter
    coll::Communicator* shard = nullptr;     // null: the world
    coll::Communicator* replicas = nullptr;  // all-reduces the reduced gradient shards; null: no replicas
  };

  // The policy's answers, asked once in setup(). The defaults: the world is the shard group, the gradient shards
  // are at the recipe's gradient dtype, and every unit is freed when released.
  virtual ShardGroups shard_groups() { return {.shard = data_parallel()}; }
  virtual DType gradient_shard_dtype() const { return options_.recipe.grads; }
  // Whether a unit of `count` elements stays gathered once fetched, until the next optimizer step.
  virtual bool keeps_gathered(size_t /*count*/) const { return false; }
  // Whether a compute-precision parameter shard is kept between uses; when not, each all-gather makes one from the
  // master shard and frees it after.
  virtual bool keeps_parameter_shard() const { return true; }
  // Whether the parameter shards live in host memory (StrategyContext::parameter_host), each copied up to the
  // device for its all-gather.
  virtual bool offloads_parameters() const { return false; }
  // Whether a unit's gradient shard is made by its first reduce-scatter of a step and freed after the optimizer
  // step (zero_grad(set_to_none=True)), rather than kept from set-up.
  virtual bool makes_gradient_shards_in_backward() const { return false; }
  // Whether the root's gradients are charged in the parts autograd makes (flat.h RootGradientCharges): the head's
  // and the final norm's as the head's backward reaches them, the embeddings' when backward reaches them; else whole
  // from the root's before_backward.
  virtual bool makes_root_gradients_in_parts() const { return false; }

  // Whether a unit's gradients are made as FSDP1 without use_orig_params makes its FlatParameter's .grad
  // (form_flat_gradient): a block's parameters are views of the flat parameter, so each view's gradient is made
  // when backward reaches the op reading it (flat.h BlockGradients), autograd holds them until the unit's last one,
  // and the views' split backward then concatenates them into one new [n_u] tensor, beside them for a moment,
  // which AccumulateGrad makes the .grad (the root's likewise, from its parts); the post-backward hook
  // (_runtime_utils.py _reduce_grad) reduce-scatters it into a new [S_u] tensor at the gradient dtype (unless that
  // is the gradient shard itself: the step's first, at the shard's dtype), and frees it. The F.pad copy it
  // reduce-scatters from when n_u is not a multiple of M is not charged: a shrunk unit pads where the full-scale one
  // does not (every preset's units are multiples of h, so of 64), and would charge a whole unit more.
  virtual bool forms_flat_gradient() const { return false; }

  // The views' gradients concatenated into the FlatParameter's .grad ([n_u] charged, the buffer M·S_u), the views'
  // freed, when the policy forms_flat_gradient(): autograd's part, before the post-backward hook's reduce_gradients.
  void form_flat_gradient(int unit);

  // Charges the embeddings' part of the root's gradients, when the policy makes them in parts.
  void before_embedding_backward() override;
  // Charges a parameter's gradient as autograd makes it: a block's when the policy forms the flat gradient, the
  // root's when it makes them in parts.
  void gradient_made(int unit, size_t offset) override;
  // Whether the policy charges `unit`'s gathered parameters itself, part by part (ZeRO-3's root: the embedding and
  // the head fetched and released apart): the gathered buffer then holds the data uncharged.
  virtual bool charges_gathered_itself(int /*unit*/) const { return false; }
  // Whether the policy charges `unit`'s gradients itself as backward makes them (ZeRO-3: one parameter's .grad at a
  // time): the unit's gradient buffer then holds the data uncharged.
  virtual bool charges_gradients_itself(int /*unit*/) const { return false; }

  double gradient_sum_of_squares() override;
  // Every unit's optimizer step (update_unit), then release_stale_units().
  void update(double lr, float grad_scale) override;
  // AdamW on `unit`'s shard, its gradient shard zeroed after.
  void update_unit(int unit, double lr, float grad_scale);
  // Frees the units kept gathered: their parameters changed.
  void release_stale_units();

  // All-gathers `unit`'s parameters (phase "<pass> all-gather, unit u") and binds them to the model; nothing
  // when the unit is already gathered.
  void gather(int unit, std::string_view pass);
  // Frees `unit`'s gathered parameters, except a unit kept gathered unless `stale` (its shard was just updated).
  void release(int unit, bool stale = false);
  // Allocates `unit`'s gradients [M·S_u] and binds them to the model for its backward.
  void begin_gradients(int unit);
  // Reduce-scatters (averages) `unit`'s gradients over the shard group in place, all-reduces this rank's part
  // across the replicas, adds it to the gradient shard and frees the unit's gradients.
  void reduce_gradients(int unit);

  // Over TP, the "data-parallel t" group of the D ranks holding this rank's slice; null without TP (the world).
  coll::Communicator* data_parallel() const { return mesh_.data.get(); }
  // M, the ranks a unit is sharded over.
  int shard_size() const { return groups_.alone ? 1 : (groups_.shard != nullptr ? groups_.shard : &world_)->size(); }

  // The units that follow `unit` in this pass's order, nearest first. Forward: u+1, ..., L; backward: u−1, ..., 1,
  // and L, ..., 1 from the root (whose backward encloses every block's).
  std::vector<int> following_units(int unit, bool forward) const;
  size_t padded_count(int unit) const { return units_[static_cast<size_t>(unit)].shard.padded; }
  size_t shard_elements(int unit) const { return units_[static_cast<size_t>(unit)].shard.shard; }
  // Counts one unit's optimizer step over PCIe (`elements` as a shrunk run charges them): count_offload's, or with
  // the parameters offloaded, what leaves the device for the host copies.
  void count_step_traffic(size_t elements, size_t gradient_bytes);

 private:
  struct UnitState {
    ShardInfo shard;
    Buffer params;      // [S_u] recipe.params: this rank's shard, when the policy keeps one
    Buffer grads;       // [S_u] gradient_shard_dtype(): this rank's gradient shard (made in backward, or at set-up)
    Buffer gathered;    // [M·S_u] recipe.params while the unit is gathered
    Buffer unit_grads;  // [M·S_u] recipe.grads while the unit's backward runs
    // With forms_flat_gradient(), a block's: [n_u] recipe.grads, its views' gradients, made tensor by tensor until
    // the unit's backward ends (unit_grads then holds their concatenation)
    BlockGradients views;
    std::unique_ptr<optim::AdamWState> optimizer;
    std::vector<optim::DecayRange> decay;  // unit coordinates
    bool keep_gathered = false;            // stays gathered once fetched, until the next optimizer step
  };

  // The policy makes gradient shards in backward and they live on the device (under optimizer offload they are
  // the host's, kept from set-up as FSDP1's _cpu_grad is).
  bool lazy_gradient_shards() const;
  coll::Communicator& shard_group() { return groups_.shard != nullptr ? *groups_.shard : world_; }
  int shard_rank() const { return groups_.alone ? 0 : (groups_.shard != nullptr ? groups_.shard : &world_)->rank(); }

  // The unit's initial values, elements [shard.offset, shard.offset + shard.valid) of its (local) layout, into
  // `out` (fp32): the full unit's seeded initialisation, or over TP this rank's slice of it.
  void initial_shard(int unit, const ShardInfo& shard, float* out);

  std::vector<UnitState> units_;
  ShardGroups groups_;
  // Over TP (setup): the "tensor-parallel" group of the rank's T slices, the model's view of it, and the
  // "data-parallel" group of the D ranks holding the same slice; null without --tp.
  struct MeshGroups {
    std::unique_ptr<coll::Communicator> tensor, data;
    std::unique_ptr<GroupTensorParallel> view;
  } mesh_;
  // Over TP: [units][params][local elements] the full tensor's element each local element holds, or −1
  // (tp_slice_index); empty on a device without data.
  std::vector<std::vector<std::vector<int64_t>>> tp_index_;
  RootGradientCharges root_charges_;  // charged only: the root's unit gradients in parts, as autograd makes them
};

}  // namespace emu::strategy
