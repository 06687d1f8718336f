// FSDP2 as PyTorch 2.x runs it: fully_shard on every decoder block and on the root (embeddings, final norm, head),
// as torchtitan and accelerate apply it, with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) in the
// mixed recipe (torch/distributed/fsdp/_fully_shard/: _fsdp_param.py, _fsdp_param_group.py,
// _fsdp_collectives.py, _fsdp_state.py). Every parameter is sharded on dim 0 on its own (dim0_shard.h).
//
// Per rank and unit u, N ranks, S_u = Σ_p ceil(rows_p / N)·row_p (dim0_shard.h), n_u real elements:
//   sharded parameter  [S_u] fp32 in the mixed recipe, else the recipe's dtype; kParameters. It is the
//                      optimizer's parameter: no separate master copy, no low-precision shard kept (FSDPParam keeps
//                      only _sharded_param_data). In host memory under --offload (CPUOffloadPolicy).
//   sharded gradient   [S_u] reduce dtype (fp32 in the mixed recipe); kGradients. Made by the unit's first
//                      reduce-scatter of a step (the reduce-scatter output becomes sharded_param.grad), added into by
//                      later micro-batches, freed after the optimizer step (zero_grad(set_to_none=True)). In host
//                      memory under --offload (copied down from the reduce-scatter output, which is then freed).
//   Adam m, v          [S_u] over the sharded parameters (fp32 in the mixed recipe).
// and while the unit is in use:
//   all-gather output  [N·S_u] param dtype, kBuckets (foreach_all_gather). This rank's shard is cast into its slot
//                      (the all-gather input is a view of the output), gathered, then copied out into the unsharded
//                      parameters (foreach_all_gather_copy_out). In forward the output is kept until the next unit's
//                      copy-out (FSDPCommContext.all_gather_state, for the implicit prefetch) and the root's
//                      post-forward frees the last; in backward it is freed right after its copy-out. Under
//                      --offload the fp32 shard is first copied to the device (a transient [S_u], kBuckets).
//   unsharded params   [N·S_u] param dtype, kParameters: each parameter's all_gather_outputs tensor, padded on dim 0,
//                      allocated at copy-out and freed at reshard (free_storage).
//   unsharded grads    [n_u] gradient dtype, kGradients: what autograd makes for the unsharded parameters, a
//                      block's tensor by tensor as backward reaches each (flat.h BlockGradients); the root's tensor
//                      by tensor too, the head's and the final norm's as the head's backward reaches them, the
//                      embeddings' when backward reaches them (flat.h RootGradientCharges).
//   reduce-scatter in  [N·S_u] reduce dtype, kBuckets (foreach_reduce): the unsharded gradients cast into it rank
//                      by rank (foreach_reduce_scatter_copy_in), then freed; reduce-scattered into the sharded
//                      gradient. Kept until the next unit's reduce-scatter (FSDPCommContext.reduce_scatter_states,
//                      reduce_scatter_max_input_buffers = 1); the last unit's until the end of backward.
//
// Order, per micro-batch (units: the root, whose forward encloses the blocks', then blocks 1..L):
//   forward   each unit all-gathered as its forward begins; each block resharded when its forward ends
//             (reshard_after_forward=True), kept until its backward (False), or resharded to M ranks (an int M:
//             FSDPParam.to_sharded_post_forward keeps this rank's 1/M slice of each padded unsharded tensor,
//             [N·S_u/M] param dtype, kParameters, and backward all-gathers it within the context's group of M
//             consecutive ranks); the root never resharded after forward (FSDPState._lazy_init sets the root's
//             post_forward_mesh_info to None)
//   backward  each unit unsharded as its backward begins (a no-op when kept or prefetched), then the next unit in
//             backward all-gathered ahead (FSDPParamGroup._backward_prefetch: one unit, the default); when its
//             backward ends it is resharded, the previous reduce-scatter input freed, its gradients reduced.
// Traffic: all-gathers of N·S_u at the param dtype (bf16 in mixed), reduce-scatters of N·S_u at the reduce dtype
// (fp32 in mixed, twice FSDP1's bf16 bytes). emu's collectives are blocking: prefetch shows in memory, not overlap.
//
// Over tensor-parallel layers (--tp T, torchtitan's 2-D mesh: parallelize_module with Megatron's column- and
// row-parallel plan, then fully_shard over the "dp_shard" mesh dimension; torchtitan/models/llama3/infra/
// parallelize.py): the world is D = N/T replicas of T consecutive ranks (strategy.h Mesh), the model runs the
// rank's TP slice with its activation all-reduces in the "tensor-parallel d" group (workloads/model/
// tensor_parallel.h, as `tp` runs it), and everything above is that slice sharded over the "data-parallel t"
// group of D: N reads D, n_u is the slice's. The norm weights, whole on every TP rank, are sharded like the rest
// and count once in the gradient norm (TP rank 0's), which sums over the world. With --sequence-parallel (torchtitan's
// default plan: SequenceParallel on the norms, PrepareModuleInput on attention and feed-forward) the model runs tp's
// sequence parallelism (norms and residual stream on 1/T of the rows, reduce-scatters and all-gathers in place of
// the all-reduces), and each norm weight's gradient, partial over the TP group, is all-reduced over it in every
// backward before its unit's reduce-scatter (sum_sequence_parallel_norms); under --pp once per step, before the
// stage's reduce-scatters, at the reduce dtype.
//
// Over pipeline stages (--pp P, with or without --tp T: torchtitan's PP × FSDP2 and its 3-D, TP 8 × PP 2 × FSDP 4
// for llama2-70b on 64 GPUs): the model split into P stages as pp splits it (pipeline.h, stage_runner.h), each a
// PipelineStage of torch.distributed.pipelining whose module is fully_shard-ed per block and at its root over the
// stage's "data-parallel p·T + t" group of D = N/(T·P) ranks (torchtitan/models/llama3/infra/parallelize.py,
// apply_fsdp over the dp_shard mesh dimension), the schedule (gpipe, 1f1b) run as pp runs it, activations over the
// "pipeline" group. A stage's root holds the root tensors it runs: the embeddings on the first stage, the final norm
// and the head on the last (tied embeddings refused), sharded and gathered alone. What differs from the above:
//   forward   reshard_after_forward=False, torchtitan's apply_fsdp default when PP is on (no block gathered again
//             per micro-batch): each unit all-gathered at its first forward of the step
//   backward  PipelineStage.backward_maybe_with_nosync sets set_requires_gradient_sync(False),
//             set_reshard_after_backward(False) and set_is_last_backward(False) on the stage module for every
//             micro-batch: the units stay unsharded until the step's end (Σ_u D·S_u param dtype, the whole stage),
//             and the unsharded gradients are summed over the micro-batches, at the reduce dtype
//             (FSDPParam.to_accumulated_grad_if_needed / accumulate_unsharded_grad_if_needed: an fp32 [n_u] per
//             unit in the mixed recipe, beside each backward's bf16 ones until that unit's backward ends)
//   the end  after the last micro-batch's backward the stage sets the three back to True and runs post_backward of
//             every parameter group of the stage module (stage.py: run_post_backward, in newer versions
//             perform_reduce_grad), root first, then the blocks: each resharded and reduce-scattered once (finish_
//             gradients), one reduce-scatter input alive at a time
// So per step each unit moves one all-gather and one reduce-scatter, however many micro-batches. The gradient norm
// sums over the world (each element in one shard of one stage), the loss over the pipeline.
//
// Interleaved (--virtual-stages V, torchtitan's Interleaved1F1B: ScheduleInterleaved1F1B over V PipelineStages per
// rank, stage ids p, p + P, … as its "loop" placement gives them): the stage's blocks are pp's V chunks (chunk v of
// stage p layer group v·P + p, pipeline.h interleaved_chunks; the embeddings with chunk 0 of the first stage, the
// final norm and head with chunk V − 1 of the last), and torchtitan fully_shard-s each chunk's model on its own (its
// blocks as units, its root over the chunk's root tensors): V FSDP modules per rank. The schedule is pp's
// interleaved 1F1B (torch's warm-up, (V − 1)·P + 2(P − s − 1) forwards in rounds of P micro-batches per chunk, is
// Megatron's); a micro-batch crosses V·P − 1 boundaries each way, the last stage's chunk v handing it to the first
// stage's chunk v + 1. What differs from one chunk:
//   forward   each chunk's units all-gathered at the chunk's first forward (all chunks within the warm-up, before
//             any backward) and kept: every chunk of the stage unsharded at once; each chunk's own root post-forward
//             frees the last all-gather output kept for overlap
//   backward  each chunk's post-backward runs right after that chunk's last backward of the step (the multi-stage
//             schedules' REDUCE_GRAD action, schedules.py _add_reduce_grad), not at the step's end: chunk V − 1's
//             first, chunk 0's last, each resharding its units and reduce-scattering their summed gradients while
//             the other chunks' backwards go on
// Still one all-gather and one reduce-scatter per unit per step.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "emu/check.h"
#include "strategies/dim0_shard.h"
#include "strategies/flat.h"
#include "strategies/stage_runner.h"
#include "strategies/strategy.h"
#include "workloads/model/shrink.h"
#include "workloads/optim/adamw_state.h"

namespace emu::strategy {
namespace {

class Fsdp2 final : public Strategy {
 public:
  using Strategy::Strategy;

  void setup() override {
    const Mesh mesh = mesh_of(options_, world_.size(), world_.rank());
    if (mesh.tensor > 1) {  // the stage's T ranks (one stage without --pp)
      tp_group_ = split_tensor_group(mesh);
      tensor_ = std::make_unique<GroupTensorParallel>(*tp_group_);
      model_.set_tensor_parallel(tensor_.get());
    }
    if (mesh.tensor > 1 || mesh.pipeline > 1) dp_group_ = split_data_group(mesh);  // the same stage and TP slice
    if (mesh.pipeline > 1) set_up_stage(mesh);
    const int m = options_.fsdp2.post_forward_ranks;
    if (m > 0 && (context_.post_forward == nullptr || context_.post_forward->size() != m)) {
      throw InputError(fmt::format("fsdp2 reshard_after_forward={} needs a group of {} consecutive ranks", m, m));
    }
    const optim::PrecisionRecipe& recipe = options_.recipe;
    sharded_dtype_ = recipe.has_master ? DType::kF32 : recipe.params;
    // torch.optim.AdamW over the sharded parameters: no master copy, moments at the recipe's dtype.
    optim::PrecisionRecipe optimizer_recipe = recipe;
    optimizer_recipe.has_master = false;
    optimizer_recipe.params = sharded_dtype_;
    optimizer_recipe.grads = sharded_dtype_;
    const int rank = shards().rank();
    units_.resize(static_cast<size_t>(model_.num_units()));
    index_.resize(units_.size());
    for (int u = 0; u < model_.num_units(); ++u) {
      if (!holds(u)) continue;
      UnitState& unit = units_[static_cast<size_t>(u)];
      const std::vector<TensorRows> rows = stage_rows(u);
      unit.shards = dim0_shards(rows, shards().size());
      // The TP slice's initial values (from the full unit's seeded initialisation; padding rows 0).
      std::vector<float> slice;
      if (tensor_ && device_.holds_data()) {
        index_[static_cast<size_t>(u)] = tp_slice_index(model_, u, tp_group_->rank(), tp_group_->size());
        slice.resize(model_.layout(u).count);
        init_tp_slice(model_, u, options_.seed, index_[static_cast<size_t>(u)], slice.data());
      }
      if (post_forward_ranks() > 0) unit.post_shards = coarser(unit.shards, post_forward_ranks());
      const uint64_t shard = unit.shards.shard;
      unit.sharded = optimizer_device().allocate(shard, sharded_dtype_, Category::kParameters,
                                                 fmt::format("unit {} sharded parameters", u),
                                                 unit.shards.charged_shard() * dtype_size(sharded_dtype_));
      const model::ParameterCharge charge{shard, static_cast<double>(unit.shards.charged_shard())};
      unit.optimizer = std::make_unique<optim::AdamWState>(optimizer_device(), optimizer_recipe, shard,
                                                           fmt::format("unit {} optimizer shard", u), charge);
      // This rank's chunk of each tensor: its initial values and, for the weight-decayed ones, its decay range
      // (in the coordinates of the all-gather output, where this rank's shard starts at rank·S).
      const uint64_t base = shard * static_cast<uint64_t>(rank);
      for (const Dim0Tensor& t : unit.shards.tensors) {
        const uint64_t valid = t.valid_rows(rank) * t.tensor.row_elements();
        const uint64_t first = t.tensor.offset + t.chunk_elements() * static_cast<uint64_t>(rank);
        void* into = element(unit.sharded.data(), sharded_dtype_, t.shard_offset);
        if (tensor_) {
          if (!slice.empty()) convert(slice.data() + first, DType::kF32, into, sharded_dtype_, valid);
        } else {
          init_into(model_, u, options_.seed, first, valid, into, sharded_dtype_);
        }
        const model::ParamInfo* info = param_at(u, t.tensor.offset);
        if (info->decay && valid > 0) unit.decay.push_back({base + t.shard_offset, base + t.shard_offset + valid});
      }
    }
  }

  std::vector<coll::Communicator*> groups() override {
    if (runner_ && tensor_) return {&world_, pipe_group_.get(), tp_group_.get(), dp_group_.get()};
    if (runner_) return {&world_, pipe_group_.get(), dp_group_.get()};
    if (tensor_) return {&world_, tp_group_.get(), dp_group_.get()};
    if (post_forward_ranks() == 0) return {&world_};
    return {&world_, context_.post_forward};
  }

  std::vector<float> full_weights(int u) override {
    if (!runner_) return stage_weights(u);
    // Each block from the stage that runs it; the root's tensors from the first stage (the embeddings) and the last
    // (the final norm and the head), the others' zeros summed away.
    std::vector<float> out(model_.full_layout(u).count, 0.0f);
    const int owner = u == 0 ? 0 : runner_->owner_of(u);
    if (holds(u)) out = stage_weights(u);
    if (u == 0) {
      pipe_group_->all_reduce(out.data(), out.data(), out.size(), DType::kF32, coll::ReduceOp::kSum, "full weights");
    } else {
      pipe_group_->broadcast(out.data(), out.data(), out.size(), DType::kF32, owner, "full weights");
    }
    return out;
  }

  // The unit's fp32 values in its full layout, from this stage's shards (the root's tensors it does not own zero).
  std::vector<float> stage_weights(int u) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    std::vector<float> mine(unit.shards.shard);
    convert(unit.sharded.data(), sharded_dtype_, mine.data(), DType::kF32, mine.size());
    std::vector<float> gathered(unit.shards.padded());
    if (shards().size() > 1) {
      shards().all_gather(mine.data(), gathered.data(), mine.size(), DType::kF32, "report: gather weights");
    } else {
      gathered = mine;
    }
    std::vector<float> whole(model_.layout(u).count);
    copy_out(unit.shards, gathered.data(), whole.data(), DType::kF32);
    if (!tensor_) return whole;
    return gather_tp_unit(model_, u, index_[static_cast<size_t>(u)], whole.data(), *tp_group_,
                          "report: gather weights");
  }

 protected:
  // With --pp: the stage's program (stage_runner.h); the loss, the last stage's, summed to every stage for reporting.
  // Interleaved (V chunks), each chunk's post-backward right after its own last backward (PipelineScheduleMulti's
  // REDUCE_GRAD); one chunk, after the step's last backward and its sends (PipelineScheduleSingle, finish_gradients).
  double run_micro_batches(std::span<const data::Batch> micro_batches, model::Hooks& hooks) override {
    if (!runner_) return Strategy::run_micro_batches(micro_batches, hooks);
    const bool interleaved = runner_->chunks()[0].size() > 1;
    const double loss = interleaved ? runner_->run(micro_batches, hooks, [this](int chunk) { post_backward(chunk); })
                                    : runner_->run(micro_batches, hooks);
    return sum_over(*pipe_group_, loss, "pipeline loss (reporting)");
  }

  void finish_gradients() override {
    if (runner_ && runner_->chunks()[0].size() == 1) post_backward(0);
  }

  // torch.optim.AdamW's tensors: every parameter's local chunk, as a shrunk run charges it.
  std::vector<uint64_t> optimizer_tensors() const override {
    std::vector<uint64_t> tensors;
    for (const UnitState& unit : units_) {
      for (const Dim0Tensor& t : unit.shards.tensors) tensors.push_back(t.charged_chunk());
    }
    return tensors;
  }

  double gradient_sum_of_squares() override {
    double local = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
      const UnitState& unit = units_[u];
      if (!unit.sharded_grad.allocated()) continue;  // a unit of another stage
      if (!tensor_) {
        local += optim::grad_sum_of_squares(optim::ConstElementSpan::of(unit.sharded_grad));
        continue;
      }
      // Over TP the replicated norm weights' gradients are equal on every TP rank: TP rank 0's count.
      const DType dtype = unit.sharded_grad.dtype();
      for (const Dim0Tensor& t : unit.shards.tensors) {
        if (tp_group_->rank() != 0 && replicated(static_cast<int>(u), t.tensor.offset)) continue;
        const uint64_t valid = t.valid_rows(shards().rank()) * t.tensor.row_elements();
        local += optim::grad_sum_of_squares(
            optim::ConstElementSpan(element(unit.sharded_grad.data(), dtype, t.shard_offset), valid, dtype));
      }
    }
    return world_.size() > 1 ? sum_over_world(local, "clip: gradient norm") : local;
  }

  void update(double lr, float grad_scale) override {
    const uint64_t base = static_cast<uint64_t>(shards().rank());
    for (UnitState& unit : units_) {
      if (!unit.sharded_grad.allocated()) continue;  // no backward reached the unit this step
      unit.optimizer->step(options_.adamw, optim::ElementSpan::of(unit.sharded),
                           optim::ConstElementSpan::of(unit.sharded_grad), base * unit.shards.shard, unit.decay, lr,
                           grad_scale);
      unit.sharded_grad.reset();  // zero_grad(set_to_none=True)
    }
  }

  void before_forward(int u) override {
    unshard(u, "forward");
    wait_for_unshard(u, /*forward=*/true);
  }

  void after_forward(int u) override {
    if (u == 0) {
      kept_all_gather_.reset();  // the root's post-forward frees the last all-gather output kept for overlap
      return;
    }
    if (runner_) {
      // A chunk's blocks stay unsharded from their first forward to its post-backward: reshard_after_forward=False
      // (torchtitan's default under PP), and backward keeps them (set_reshard_after_backward(False)). A chunk
      // without the root's tensors: its module's root post-forward (FSDPState._post_forward of the forward's root)
      // frees the last all-gather output after its last block.
      if (!model_.holds_root() && u == model_.last_block()) kept_all_gather_.reset();
      return;
    }
    if (post_forward_ranks() > 0) {
      reshard_to_post_forward(u);
    } else if (options_.fsdp2.reshard_after_forward) {
      reshard(u);
    }
  }

  void before_backward(int u) override {
    unshard(u, "backward");
    wait_for_unshard(u, /*forward=*/false);
    const int next = u == 0 ? model_.num_units() - 1 : u - 1;
    if (next >= 1 && holds(next)) unshard(next, "backward prefetch");
    UnitState& unit = units_[static_cast<size_t>(u)];
    const std::string what = fmt::format("unit {} unsharded gradients", u);
    if (unit.unsharded_grads.allocated() || unit.block_grads.allocated()) {
      // --pp, gradients at the reduce dtype: AccumulateGrad adds this micro-batch's into the unsharded .grad.
      model_.bind_grads(u, u == 0 ? unit.unsharded_grads.data() : unit.block_grads.data());
      return;
    }
    if (u == 0 && runner_ && runner_->stage() == 0 && !runner_->ends_model(0)) {
      // The first stage's root is its embeddings: their gradients are made when backward reaches them.
      unit.unsharded_grads =
          device_.allocate(model_.layout(0).count, options_.recipe.grads, Category::kGradients, what, 0);
      zero(unit.unsharded_grads.data(), options_.recipe.grads, model_.layout(0).count);
      root_charges_.begin(device_, model_, options_.recipe.grads, what);
      model_.bind_grads(u, unit.unsharded_grads.data());
      return;
    }
    // The root's and a block's tensor by tensor as autograd makes them (gradient_made, before_embedding_backward).
    if (u == 0) {
      unit.unsharded_grads =
          allocate_root_gradients(device_, model_, model_.layout(0).count, options_.recipe.grads, what);
      root_charges_.begin(device_, model_, options_.recipe.grads, what);
      model_.bind_grads(u, unit.unsharded_grads.data());
    } else {
      unit.block_grads.allocate(device_, model_, u, options_.recipe.grads, what);
      model_.bind_grads(u, unit.block_grads.data());
    }
  }

  void gradient_made(int u, size_t offset) override {
    if (u == 0) {
      root_charges_.made(offset);
    } else {
      units_[static_cast<size_t>(u)].block_grads.made(offset);
    }
  }

  void before_embedding_backward() override {
    root_charges_.embeddings_made();  // --pp: kept with the accumulating root gradients, charged once
  }

  void after_backward(int u) override {
    if (runner_) {
      accumulate_unsharded(u);
      return;
    }
    reshard(u);
    reduce_scatter_input_.reset();  // the previous unit's, kept until this reduce-scatter
    reduce(u);
    if (u == 0) reduce_scatter_input_.reset();  // the end of backward releases the last one
  }

 private:
  struct UnitState {
    Dim0Shards shards;
    Dim0Shards post_shards;      // reshard_after_forward=M: the same tensors in M larger chunks
    Buffer post_forward;         // [N·S/M] param dtype, kParameters: from the unit's forward to its backward
    Buffer sharded;              // [S] the sharded parameters (optimizer device)
    Buffer sharded_grad;         // [S] reduce dtype, from the first reduce-scatter of a step until the optimizer step
    Buffer all_gather;           // [N·S] param dtype: between the unit's all-gather and its copy-out
    Buffer unsharded;            // [N·S] param dtype: while unsharded
    Buffer unsharded_grads;      // the root's [n_0] grads dtype: while backward makes them
    BlockGradients block_grads;  // a block's [n_u] grads dtype, made tensor by tensor, until its reduce-scatter
    // --pp with gradients below the reduce dtype: [n_u] reduce dtype, kGradients, the unsharded gradients summed
    // over the step's micro-batches (FSDPParam.unsharded_accumulated_grad), until the stage's last backward.
    Buffer accumulated;
    std::unique_ptr<optim::AdamWState> optimizer;
    std::vector<optim::DecayRange> decay;  // all-gather-output coordinates
  };

  const model::ParamInfo* param_at(int u, uint64_t offset) const {
    for (const model::ParamInfo& p : model_.layout(u).params) {
      if (p.offset == offset) return &p;
    }
    EMU_CHECK(false, "unit {} has no parameter at offset {}", u, offset);
    return nullptr;
  }

  DType reduce_dtype() const { return sharded_dtype_; }

  // Bytes a buffer of the unit's N·S elements is charged at `dtype`.
  static size_t padded_bytes(const UnitState& unit, DType dtype) {
    return unit.shards.charged_padded() * dtype_size(dtype);
  }

  // foreach_all_gather: casts this rank's shard into its slot of a new all-gather output and gathers the others.
  void unshard(int u, std::string_view pass) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    if (unit.unsharded.allocated() || unit.all_gather.allocated()) return;  // unsharded, or already gathering
    const DType dtype = options_.recipe.params;
    const std::string phase = fmt::format("{} all-gather, unit {}", pass, u);
    PhaseScope scope(device_.memory(), phase);
    if (unit.post_forward.allocated()) {  // within the post-forward group, from this rank's 1/M
      coll::Communicator& group = *context_.post_forward;
      const uint64_t part = unit.post_shards.shard;
      unit.all_gather = device_.allocate(unit.shards.padded(), dtype, Category::kBuckets,
                                         fmt::format("unit {} all-gather output", u), padded_bytes(unit, dtype));
      void* mine = element(unit.all_gather.data(), dtype, part * static_cast<uint64_t>(group.rank()));
      convert(unit.post_forward.data(), dtype, mine, dtype, part);
      group.all_gather(mine, unit.all_gather.data(), part, dtype, phase);
      return;
    }
    const uint64_t shard = unit.shards.shard;
    Buffer on_device;  // CPUOffloadPolicy: the host shard copied to the device for the cast
    const void* source = unit.sharded.data();
    if (context_.offload != nullptr) {
      const size_t bytes = unit.shards.charged_shard() * dtype_size(sharded_dtype_);
      on_device = device_.allocate(shard, sharded_dtype_, Category::kBuckets,
                                   fmt::format("unit {} sharded parameters on the device", u), bytes);
      convert(unit.sharded.data(), sharded_dtype_, on_device.data(), sharded_dtype_, shard);
      source = on_device.data();
      host_traffic_.host_to_device += bytes;
    }
    unit.all_gather = device_.allocate(unit.shards.padded(), dtype, Category::kBuckets,
                                       fmt::format("unit {} all-gather output", u), padded_bytes(unit, dtype));
    void* mine = element(unit.all_gather.data(), dtype, shard * static_cast<uint64_t>(shards().rank()));
    convert(source, sharded_dtype_, mine, dtype, shard);
    on_device.reset();
    if (shards().size() > 1) shards().all_gather(mine, unit.all_gather.data(), shard, dtype, phase);
  }

  // foreach_all_gather_copy_out: the unsharded parameters from the all-gather output.
  void wait_for_unshard(int u, bool forward) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    if (unit.unsharded.allocated()) return;
    if (forward) kept_all_gather_.reset();  // the previous unit's output, kept for overlap until this copy-out
    const DType dtype = options_.recipe.params;
    // A stage's root shards only the tensors it owns: the model reads the root's whole layout, the rest zero.
    const size_t count = std::max<size_t>(unit.shards.padded(), model_.layout(u).count);
    unit.unsharded = device_.allocate(count, dtype, Category::kParameters,
                                      fmt::format("unit {} unsharded parameters", u), padded_bytes(unit, dtype));
    if (count > unit.shards.padded()) zero(unit.unsharded.data(), dtype, count);
    const bool from_post_forward = unit.post_forward.allocated();
    copy_out(from_post_forward ? unit.post_shards : unit.shards, unit.all_gather.data(), unit.unsharded.data(), dtype);
    unit.post_forward.reset();
    model_.bind_weights(u, unit.unsharded.data());
    if (forward && shards().size() > 1) {
      kept_all_gather_ = std::move(unit.all_gather);
    } else {
      unit.all_gather.reset();
    }
  }

  // FSDPParam.to_sharded_post_forward: this rank's 1/M slice of each padded unsharded tensor kept (cloned) until
  // the unit's backward, the unsharded parameters freed.
  void reshard_to_post_forward(int u) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    const DType dtype = options_.recipe.params;
    coll::Communicator& group = *context_.post_forward;
    unit.post_forward = device_.allocate(
        unit.post_shards.shard, dtype, Category::kParameters, fmt::format("unit {} post-forward shard", u),
        unit.shards.charged_padded() / static_cast<uint64_t>(group.size()) * dtype_size(dtype));
    copy_rank_in(unit.post_shards, group.rank(), unit.unsharded.data(), dtype, unit.post_forward.data(), dtype);
    reshard(u);
  }

  int post_forward_ranks() const { return options_.fsdp2.post_forward_ranks; }

  // --pp (torchtitan's PP × FSDP2): the pipeline's group of the P ranks with the same d and t, the stage's blocks
  // split as pp splits them, in V chunks with --virtual-stages (stage_runner.h), the schedule run as pp runs it.
  // Tied embeddings are refused (app): their copy on the last stage would need the first stage's sum, which FSDP2
  // does not make.
  void set_up_stage(const Mesh& mesh) {
    const int across = mesh.data_rank() * mesh.tensor + mesh.tensor_rank();  // d·T + t
    pipe_group_ = split_group(across, mesh.pipeline_rank(), mesh.pipeline, fmt::format("pipeline {}", across));
    EMU_CHECK(!model_.config().tie_embeddings, "fsdp2 with --pp: tied embeddings are refused at start-up");
    runner_ =
        std::make_unique<StageRunner>(model_, device_, *pipe_group_, options_.pipeline.schedule, mesh.pipeline_rank(),
                                      stage_chunks(model_, mesh.pipeline, options_.pipeline.virtual_stages));
    runner_->set_chunk(0);
  }

  // This stage's chunks of blocks (one unless interleaved).
  const std::vector<StageBlocks>& own_chunks() const {
    return runner_->chunks()[static_cast<size_t>(runner_->stage())];
  }

  // Whether this rank holds unit `u`: every unit without --pp; with it the blocks of the stage's chunks, and the root
  // on the first and the last stage.
  bool holds(int u) const {
    if (!runner_) return true;
    if (u == 0) return runner_->holds_root();
    return std::any_of(own_chunks().begin(), own_chunks().end(),
                       [u](const StageBlocks& chunk) { return u >= chunk.first && u <= chunk.last; });
  }

  // The post-backward of the stage's chunk `chunk`, an FSDP module of its own (PipelineStage._post_backward, run by
  // perform_reduce_grad: set_is_last_backward, set_reshard_after_backward and set_requires_gradient_sync all True,
  // then post_backward of every FSDP parameter group the module's state holds, _state_ctx.all_states: the chunk's
  // root first, its tensors on the chunk that begins or ends the model, then its blocks in order): each unit
  // resharded and its gradients, summed over the step's micro-batches, reduce-scattered, one reduce-scatter input
  // alive at a time.
  void post_backward(int chunk) {
    const StageBlocks& blocks = own_chunks()[static_cast<size_t>(chunk)];
    const bool root = runner_->starts_model(chunk) || runner_->ends_model(chunk);
    for (int u = root ? 0 : blocks.first; u <= blocks.last; u = u == 0 ? blocks.first : u + 1) {
      reshard(u);
      reduce_scatter_input_.reset();
      reduce(u);
    }
    reduce_scatter_input_.reset();
  }

  // The tensors of unit `u` this rank shards: all of them, or of a stage's root those it owns (the embeddings on
  // the first stage, the final norm and the head on the last).
  std::vector<TensorRows> stage_rows(int u) const {
    std::vector<TensorRows> rows = tensor_rows(model_.config(), model_.layout(u));
    if (!runner_ || u != 0) return rows;
    std::vector<TensorRows> owned;
    const int stage = runner_->stage();
    for (size_t p = 0; p < rows.size(); ++p) {
      const bool first = stage == 0 && embedding_side(model_.config(), p);
      const bool last = stage == runner_->stages() - 1 && head_side(model_.config(), p);
      if (first || last) owned.push_back(rows[p]);
    }
    return owned;
  }

  // --pp, each micro-batch's backward without gradient sync (PipelineStage.backward_maybe_with_nosync: FSDP's
  // set_requires_gradient_sync(False) and set_reshard_after_backward(False) on the stage module): the unit stays
  // unsharded and FSDPParamGroup.post_backward keeps its gradients unsharded. Below the reduce dtype (bf16 under
  // MixedPrecisionPolicy(reduce_dtype=fp32)) the first micro-batch's are upcast into an accumulator
  // (FSDPParam.to_accumulated_grad_if_needed) and later ones added into it and freed
  // (accumulate_unsharded_grad_if_needed); at the reduce dtype the .grad itself accumulates (before_backward binds
  // it again).
  void accumulate_unsharded(int u) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    const DType grads = options_.recipe.grads, reduce = reduce_dtype();
    if (grads == reduce) return;
    const size_t count = model_.layout(u).count;
    if (!unit.accumulated.allocated()) {
      uint64_t charged = 0;
      for (const Dim0Tensor& t : unit.shards.tensors) charged += t.tensor.charged;
      unit.accumulated =
          device_.allocate(count, reduce, Category::kGradients,
                           fmt::format("unit {} accumulated unsharded gradients", u), charged * dtype_size(reduce));
      zero(unit.accumulated.data(), reduce, count);
    }
    accumulate(u == 0 ? unit.unsharded_grads.data() : unit.block_grads.data(), grads, unit.accumulated.data(), reduce,
               count);
    model_.bind_grads(u, nullptr);
    unit.unsharded_grads.reset();
    unit.block_grads.reset();
    if (u == 0) root_charges_.reset();
  }

  // The ranks a unit is sharded over: the data-parallel group over TP, else the world.
  coll::Communicator& shards() const { return dp_group_ ? *dp_group_ : world_; }

  // Over TP, whether the unit's tensor at `offset` is held whole by every TP rank (a norm weight).
  bool replicated(int u, uint64_t offset) const {
    const model::ParamInfo* info = param_at(u, offset);
    return tp_replicated(model_, u, static_cast<size_t>(info - model_.layout(u).params.data()));
  }

  // Sequence parallelism over TP: each rank's norm weight gradients cover its rows of the sequence only (DTensor
  // Partial over the TP mesh dimension, the weights Replicate). FSDPParam's unsharded gradient redistributes each to
  // its parameter's placement before foreach_reduce copies it in (_get_grad_inner_tensor): one all-reduce over the
  // TP group per norm weight in every backward, at the gradient dtype `dtype`. Under --pp, once per step at the
  // stage's last backward: the gradients summed over the micro-batches (Partial too, in the .grad or in
  // unsharded_accumulated_grad at the reduce dtype) are redistributed then.
  void sum_sequence_parallel_norms(int u, void* grads, DType dtype) {
    if (!tensor_ || !model_.options().sequence_parallel) return;
    for (const Dim0Tensor& t : units_[static_cast<size_t>(u)].shards.tensors) {  // a stage's root: those it owns
      if (!replicated(u, t.tensor.offset)) continue;                             // a TP slice, not a norm weight
      void* data = device_.holds_data() ? element(grads, dtype, t.tensor.offset) : nullptr;
      tp_group_->all_reduce(data, data, t.tensor.count, dtype, coll::ReduceOp::kSum,
                            "tp all-reduce, sequence-parallel norm gradients");
    }
  }

  void reshard(int u) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    model_.bind_weights(u, nullptr);
    unit.unsharded.reset();
  }

  // foreach_reduce: the unsharded gradients cast into the reduce-scatter input rank by rank, freed, reduce-scattered
  // (averaged) into a new sharded gradient or added into this step's.
  void reduce(int u) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    const DType dtype = reduce_dtype();
    const std::string phase = fmt::format("backward reduce-scatter, unit {}", u);
    PhaseScope scope(device_.memory(), phase);
    const uint64_t shard = unit.shards.shard;
    reduce_scatter_input_ = device_.allocate(unit.shards.padded(), dtype, Category::kBuckets,
                                             fmt::format("unit {} reduce-scatter input", u), padded_bytes(unit, dtype));
    if (unit.accumulated.allocated()) {
      sum_sequence_parallel_norms(u, unit.accumulated.data(), dtype);
      copy_in(unit.shards, unit.accumulated.data(), dtype, reduce_scatter_input_.data(), dtype);
    } else {
      if (u > 0) unit.block_grads.check_complete();
      sum_sequence_parallel_norms(u, u == 0 ? unit.unsharded_grads.data() : unit.block_grads.data(),
                                  options_.recipe.grads);
      copy_in(unit.shards, u == 0 ? unit.unsharded_grads.data() : unit.block_grads.data(), options_.recipe.grads,
              reduce_scatter_input_.data(), dtype);
    }
    model_.bind_grads(u, nullptr);
    unit.accumulated.reset();
    unit.unsharded_grads.reset();
    unit.block_grads.reset();
    if (u == 0) root_charges_.reset();
    Device& host = optimizer_device();
    const size_t shard_bytes = unit.shards.charged_shard() * dtype_size(dtype);
    Buffer output = device_.allocate(shard, dtype, Category::kGradients,
                                     fmt::format("unit {} reduce-scatter output", u), shard_bytes);
    void* mine = element(reduce_scatter_input_.data(), dtype, shard * static_cast<uint64_t>(shards().rank()));
    if (shards().size() > 1) {
      shards().reduce_scatter(reduce_scatter_input_.data(), output.data(), shard, dtype, coll::ReduceOp::kAvg, phase);
    } else {
      convert(mine, dtype, output.data(), dtype, shard);
    }
    if (context_.offload != nullptr) host_traffic_.device_to_host += shard_bytes;
    if (!unit.sharded_grad.allocated() && &host == &device_) {
      unit.sharded_grad = std::move(output);  // the reduce-scatter output is the sharded gradient
      return;
    }
    if (!unit.sharded_grad.allocated()) {
      unit.sharded_grad =
          host.allocate(shard, dtype, Category::kGradients, fmt::format("unit {} sharded gradients", u), shard_bytes);
    }
    accumulate(output.data(), dtype, unit.sharded_grad.data(), dtype, shard);
  }

  // Every rank's chunk of every tensor, from a buffer laid out rank after rank (the all-gather output) to the
  // tensors' rows in the unit's layout.
  static void copy_out(const Dim0Shards& shards, const void* gathered, void* unit_layout, DType dtype) {
    if (gathered == nullptr || unit_layout == nullptr) return;  // a plan's shapes: nothing to copy, rank by rank
    for (int r = 0; r < shards.ranks; ++r) {
      for (const Dim0Tensor& t : shards.tensors) {
        const uint64_t from = shards.shard * static_cast<uint64_t>(r) + t.shard_offset;
        const uint64_t to = t.tensor.offset + t.chunk_elements() * static_cast<uint64_t>(r);
        convert(element(gathered, dtype, from), dtype, element(unit_layout, dtype, to), dtype,
                t.valid_rows(r) * t.tensor.row_elements());
      }
    }
  }

  // The reverse, casting: rank `rank`'s chunk of every tensor into a shard, padding left as it is.
  static void copy_rank_in(const Dim0Shards& shards, int rank, const void* unit_layout, DType from_dtype, void* out,
                           DType dtype) {
    for (const Dim0Tensor& t : shards.tensors) {
      const uint64_t from = t.tensor.offset + t.chunk_elements() * static_cast<uint64_t>(rank);
      convert(element(unit_layout, from_dtype, from), from_dtype, element(out, dtype, t.shard_offset), dtype,
              t.valid_rows(rank) * t.tensor.row_elements());
    }
  }

  // Every rank's chunks: the unit's gradients into a buffer laid out rank after rank, padding left zero.
  static void copy_in(const Dim0Shards& shards, const void* unit_layout, DType from_dtype, void* out, DType dtype) {
    if (unit_layout == nullptr || out == nullptr) return;  // a plan's shapes: nothing to copy, rank by rank
    for (int r = 0; r < shards.ranks; ++r) {
      copy_rank_in(shards, r, unit_layout, from_dtype, element(out, dtype, shards.shard * static_cast<uint64_t>(r)),
                   dtype);
    }
  }

  std::vector<UnitState> units_;
  DType sharded_dtype_ = DType::kF32;  // the sharded parameters', gradients' and reduce-scatter's dtype
  Buffer kept_all_gather_;             // forward: the last all-gather output, until the next copy-out
  Buffer reduce_scatter_input_;        // backward: the last unit's, until the next reduce-scatter
  RootGradientCharges root_charges_;   // charged only: the root's unsharded gradients, tensor by tensor
  // Over TP (--tp): the groups (setup), the model's view of the TP group, and where each element of the slice lies
  // in the full tensor ([units][params][local elements]; not kept by a plan).
  std::unique_ptr<coll::Communicator> tp_group_, dp_group_;
  std::unique_ptr<GroupTensorParallel> tensor_;
  // With --pp: the pipeline's group and the stage's blocks and program.
  std::unique_ptr<coll::Communicator> pipe_group_;
  std::unique_ptr<StageRunner> runner_;
  std::vector<std::vector<std::vector<int64_t>>> index_;
};

}  // namespace

std::unique_ptr<Strategy> make_fsdp2(StrategyContext context, const StrategyOptions& options) {
  return std::make_unique<Fsdp2>(context, options);
}

}  // namespace emu::strategy
