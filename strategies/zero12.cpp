// ZeRO stages 1 and 2 as DeepSpeed 0.19 runs them (runtime/zero/stage_1_and_2.py, contiguous_gradients on): the
// optimizer state (1), and the gradients too (2), partitioned over the ranks; the parameters stay whole on every
// rank.
//
// The flat space of all units (root, blocks 1..L) is padded to a multiple of 2N, as DeepSpeed aligns its flat
// bit16 group (nccl_start_alignment_factor = 2), and cut into N equal shards (shard.h); rank r updates shard r.
// Per rank, with P = Ψ rounded up to 2N and S = P/N:
//   both     parameters [P] kParameters   master, m, v [S]
//   stage 1  gradients: autograd's .grad of every unit, [n_u] kGradients each, made when backward first reaches
//            the unit, the root's tensor by tensor as autograd makes them (an untied LM head's and the final norm's
//            after the head's backward, the embeddings' at the end: flat.h RootGradientCharges) and kept through the
//            micro-batches (DeepSpeed stage 1 reduces only at the accumulation boundary). With overlap_comm the
//            gradient hooks reduce in the boundary's backward (process_gradients), as stage 2 does below: each
//            unit's tensors, last first, into the bucket as its backward ends, its .grad freed then, and, when the
//            boundary is the only micro-batch, one tensor's .grad at a time (recorded:
//            llama-zero1-bf16-rbs20000-oc{,-s8,-gas2}-n2.json). Without it, after the last backward
//            DeepSpeed's reduce_gradients() walks the tensors in registration order through the ipg reduce bucket:
//            [R] kBuckets (two with overlap_comm), R = reduce_bucket_size exactly, made by the first gradient hook of
//            the backward (process_gradients -> setup_buckets, once the loss's backward is over) and freed when the
//            reduction ends. Each tensor is copied into the bucket (a tensor larger than R is reduced from its own
//            storage, DeepSpeed's extra_large_param_to_reduce); a full bucket is all-reduced (averaged) in one slice
//            per owner (reduce_into_partition), and each rank copies its part into its gradient partition kGradients
//            (grads_in_partition, made at the first reduction and freed at the step once cast). A unit's .grad is
//            freed once all its tensors are in the bucket (DeepSpeed frees each tensor's, emu each unit's).
//   stage 2  gradient partition kGradients, grads_in_partition: made by the step's first bucket reduction
//            (copy_grads_in_partition) and freed at the step once cast; over accumulated micro-batches the
//            first one's is kept (all_grad_tensors holds views of it) and each later backward makes its own at
//            its first reduction, added into the first and dropped in the epilogue (recorded:
//            llama-zero2-bf16-rbs20000-gas2-n2.json). The ipg reduce bucket [R] kBuckets (two with
//            overlap_comm) from each backward's first gradient hook to its end (DeepSpeed's setup_buckets, released
//            in the reduce epilogue). Autograd makes each tensor's .grad and DeepSpeed's hook copies
//            it into the bucket at once and points .grad into the bucket (contiguous_gradients), so one tensor's
//            .grad lives at a time: emu makes each unit's gradients in a temporary [n_u] buffer charged as the
//            unit's largest tensor (kGradients); the root's charged as its parts are made: the largest made at the
//            head (an untied head's .grad, else the final norm's) from the head's backward to the first block's
//            (a tied head's, the embedding, completed only at the end) and the embeddings' at the end. When the unit's
//            backward ends its tensors, last first, are copied into the bucket (one larger than R is reduced from the
//            unit's buffer) and the buffer is freed; a full bucket is all-reduced at once, every
//            micro-batch, and each rank adds its part to its partition: the gradients it does not own are never kept.
// Stage 1 with contiguous_gradients false (pending_grads): no ipg bucket buffer (emu's is host scratch, charged
// nothing); autograd's .grads wait where they were made and every one is kept to step(), where the ones outside the
// partition are freed first (free_grad_in_param_list) and the partition's, its whole tensors, stay to the cast; a
// bucket of several tensors is flattened into a new tensor for its all-reduce (allreduce_bucket: kBuckets, the
// tensors as charged), all-reduced whole (buffered_reduce_fallback, whatever use_multi_rank_bucket_allreduce says),
// and no grads_in_partition is made (emu's partition holds the sums, charged nothing). Recorded:
// llama-zero1-bf16-rbs20000-nocontig{,-s8,-oc,-oc-s8}-n2.json.
// Both stages' partition holds S elements but is charged as DeepSpeed sizes grads_in_partition: for the whole of
// every tensor that meets the rank's S elements, in the module's registration order (the embeddings, the blocks,
// the final norm and head; shard.h whole_tensors_meeting), so a tensor across a partition boundary is charged whole
// on both sides (recorded: a q_proj across rank 0's end, +8,128 B, in the recording above).
// At the step (DeepSpeed's step(): flatten(averaged_gradients).to(fp32)) the partition is flattened into a new
// [S] recipe.grads buffer and, in the mixed recipe, cast into an fp32 [S] one (kGradients, the .grad of the fp32
// partition) that AdamW reads; the flat copy is freed after the cast, the fp32 one after the step. For a moment
// the partition, its flat copy and the fp32 copy are all alive; then the partition is freed (free_grad_in_param_list
// drops its last views) and AdamW steps beside the fp32 copy alone.
// After AdamW each rank's updated shard is all-gathered (in all-gather buckets) into every rank's parameters.
//
// BF16_Optimizer (bf16_optimizer.py; a config's bf16 with data_types.grad_accum_dtype "fp32" at stage 1, without
// optimizer offload: ZeroOptions::fp32_grad_accumulation): the flat group [P] recipe.params as above, fp32 gradients
// of the whole group [P] fp32 kGradients (fp32_groups_gradients_flat) for the whole run, no reduce bucket and no
// gradient partition. Every unit's .grad (autograd's bf16) lives from its backward to the step: the backward epilogue
// (update_hp_grads) adds each tensor's, cast to fp32 (a temporary of its size), into the fp32 gradients, and a later
// micro-batch accumulates into the zeroed .grad (the backward prologue's clear_lp_grads); the engine's zero_grad
// drops them after the step. At the accumulation boundary the engine's allreduce_gradients all-reduces the fp32
// gradients as one tensor in the communication dtype (bf16: a [P] copy, kTemporaries), averaged over the
// data-parallel group; AdamW steps its [S] partition of them in place (param_partition.grad is a view), and the
// updated shard is all-gathered as above (update_lp_params); then the fp32 gradients are zeroed (clear_hp_grads).
// Recorded: llama-zero1-bf16-gaf32-n2.json, llama-zero1-bf16-gaf32-gas2-n2.json.
//
// Stage 2 accumulating in fp32 under bf16 (data_types.grad_accum_dtype "fp32", without optimizer offload:
// ZeroOptions::fp32_grad_accumulation): DeepSpeed's ZeRO optimizer keeps a compact fp32 gradient partition of the
// rank's S elements (_build_compact_grad_partition_buffer), made by the first reduction that reaches it, into which
// every reduction adds its slice (allreduce_and_copy_with_multiple_ranks' output_bucket) in place of
// grads_in_partition; over accumulated micro-batches it is the one sum (no later partition). step() hands it to the
// inner optimizer as the fp32 partition's .grad as it is (_get_preflattened_grad_partition: no flattened or fp32
// copy) and drops it after the step. Recorded: llama-zero2-bf16-rbs20000-gaf32{,-s8}-n2.json.
//
// Optimizer offload (offload_optimizer, DeepSpeed's cpu_offload): the gradient partition lives in host memory as
// fp32 for the whole run (single_partition_of_fp32_groups[i].grad), each rank's reduced block is cast to fp32 and
// sent down (4 bytes per element over PCIe), and the device keeps a staging buffer of the largest tensor
// ([largest tensor] recipe.grads kBuckets, temp_grad_buffer_for_gpu_offload) instead of a partition.
//
// Over tensor-parallel layers (--tp T, Megatron-DeepSpeed: Megatron's TP model handed to DeepSpeed with its mpu):
// the world is D = N/T replicas of T consecutive ranks (strategy.h Mesh); the model runs the rank's TP slice with
// its activation all-reduces in the "tensor-parallel d" group (workloads/model/tensor_parallel.h, as `tp` runs it),
// and DeepSpeed partitions over mpu.get_data_parallel_group(), the "data-parallel t" group of D: everything above
// (the flat group padded to 2D, the buckets, the gradient all-reduces and all-gathers, the partitions, the step's
// temporaries) is the slice's (Ψ/T plus the rank's padding rows of the vocabulary) over D ranks: N reads D. The
// gradient norm (get_grad_norm_direct) sums the partitions' squares over the world, counting a tensor whole on every
// TP rank (norm weights, GPT-2's row-parallel biases and wpe: not tensor_model_parallel) on TP rank 0 only.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>

#include "emu/check.h"
#include "strategies/analytic.h"
#include "strategies/flat.h"
#include "strategies/shard.h"
#include "strategies/strategy.h"
#include "workloads/model/layout.h"
#include "workloads/optim/adamw_state.h"

namespace emu::strategy {
namespace {

class PartitionedOptimizer final : public Strategy {
 public:
  PartitionedOptimizer(StrategyContext context, const StrategyOptions& options, int stage)
      : Strategy(context, options), stage_(stage), hooks_reduce_(stage == 2), tensorwise_(stage == 2) {}

  void setup() override {
    const Mesh mesh = mesh_of(options_, world_.size(), world_.rank());
    if (mesh.tensor > 1) {  // before the layout: the model's units become the rank's TP slice
      tp_group_ = split_tensor_group(mesh);
      dp_group_ = split_data_group(mesh);
      tensor_ = std::make_unique<GroupTensorParallel>(*tp_group_);
      model_.set_tensor_parallel(tensor_.get());
    }
    const optim::PrecisionRecipe& recipe = options_.recipe;
    flat_ = flat_layout(model_);
    shard_ = shard_of(flat_.total, dp().rank(), dp().size(), kNcclStartAlignment);
    // grads_in_partition's size: the whole tensors that meet this rank's partition, in the module's registration
    // order (shard.h whole_tensors_meeting).
    const std::vector<uint64_t> order = analytic_input(model_, 1, 1, 1).registration_order();
    partition_charge_ = whole_tensors_meeting(order, group_shard(order, dp().size(), kNcclStartAlignment),
                                              static_cast<uint64_t>(dp().rank())) *
                        dtype_size(recipe.grads);
    params_ = model::allocate_parameter_space(device_, flat_.charge, shard_.padded, recipe.params,
                                              Category::kParameters, "ZeRO parameters");
    unit_grads_.resize(static_cast<size_t>(model_.num_units()));
    if (offloaded()) {
      grads_ = model::allocate_parameter_space(optimizer_device(), flat_.charge, shard_.shard, DType::kF32,
                                               Category::kGradients, "ZeRO offload gradient partition (fp32, host)");
      const model::ParamInfo* largest = nullptr;  // the largest tensor, charged as that tensor is
      for (int u = 0; u < model_.num_units(); ++u) {
        for (const model::ParamInfo& param : model_.layout(u).params) {
          if (largest == nullptr || param.count > largest->count) largest = &param;
        }
      }
      EMU_CHECK(largest != nullptr, "ZeRO offload: a model without parameters");
      staging_ = device_.allocate(largest->count, recipe.grads, Category::kBuckets, "ZeRO offload gradient staging",
                                  model::tensor_charge(model_.config(), *largest) * dtype_size(recipe.grads));
    }
    bucket_capacity_ = options_.scaled(options_.zero.reduce_bucket_elements);
    optimizer_ = std::make_unique<optim::AdamWState>(optimizer_device(), recipe, shard_.shard,
                                                     "ZeRO optimizer partition", flat_.charge);
    if (bf16_optimizer()) {  // fp32_groups_gradients_flat: zeros_like the flat bit16 group, at fp32, all run
      hp_grads_ = model::allocate_parameter_space(device_, flat_.charge, shard_.padded, DType::kF32,
                                                  Category::kGradients, "BF16_Optimizer fp32 gradients");
    }

    std::vector<float> master(device_.holds_data() ? shard_.shard : 0);  // host scratch: the shard's initial values
    index_.resize(static_cast<size_t>(model_.num_units()));
    for (int u = 0; u < model_.num_units(); ++u) {
      const size_t at = flat_.offset[u];
      size_t lo = 0, hi = 0;
      shard_.intersect(at, at + flat_.count[u], lo, hi);
      float* mine = master.empty() ? nullptr : master.data() + (lo - shard_.offset);
      if (tensor_ && device_.holds_data()) {  // the TP slice's values, from the full unit's seeded initialisation
        index_[static_cast<size_t>(u)] = tp_slice_index(model_, u, tp_group_->rank(), tp_group_->size());
        std::vector<float> slice(flat_.count[u]);
        init_tp_slice(model_, u, options_.seed, index_[static_cast<size_t>(u)], slice.data());
        convert(slice.data(), DType::kF32, element(params_.data(), recipe.params, at), recipe.params, slice.size());
        std::copy(slice.begin() + static_cast<std::ptrdiff_t>(lo - at),
                  slice.begin() + static_cast<std::ptrdiff_t>(hi - at), mine);
      } else if (!tensor_) {
        init_into(model_, u, options_.seed, 0, flat_.count[u], element(params_.data(), recipe.params, at),
                  recipe.params);
        init_into(model_, u, options_.seed, lo - at, hi - lo, mine, DType::kF32);
      }
      auto decay = decay_ranges(model_.layout(u), at);
      decay_.insert(decay_.end(), decay.begin(), decay.end());
      model_.bind_weights(u, element(params_.data(), recipe.params, at));
    }
    if (device_.holds_data())
      optimizer_->load_master(optim::ConstElementSpan(master.data(), master.size(), DType::kF32));
  }

  std::vector<float> full_weights(int unit) override {
    // Every rank's shard of fp32 weights, gathered whole; then this unit's range.
    std::vector<float> mine(shard_.shard);
    const optim::ElementSpan master = optimizer_->master();
    if (!master.empty()) {
      convert(master.data(), master.dtype(), mine.data(), DType::kF32, mine.size());
    } else {
      convert(element(params_.data(), params_.dtype(), shard_.offset), params_.dtype(), mine.data(), DType::kF32,
              mine.size());
    }
    std::vector<float> all(shard_.padded);
    dp().all_gather(mine.data(), all.data(), shard_.shard, DType::kF32, "report: gather weights");
    const auto begin = all.begin() + static_cast<std::ptrdiff_t>(flat_.offset[unit]);
    std::vector<float> slice(begin, begin + static_cast<std::ptrdiff_t>(flat_.count[unit]));
    if (!tensor_) return slice;
    return gather_tp_unit(model_, unit, index_[static_cast<size_t>(unit)], slice.data(), *tp_group_,
                          "report: gather weights");
  }

  std::vector<coll::Communicator*> groups() override {
    if (tensor_) return {&world_, tp_group_.get(), dp_group_.get()};
    return {&world_};
  }

 protected:
  void before_backward(int unit) override {
    Buffer& grads = unit_grads_[static_cast<size_t>(unit)];
    // The root's backward is over: the .grad its head made went into the bucket there (a tied head's is made at
    // the end).
    if (tensorwise_ && unit != 0) head_grad_.reset();
    if (stage_ == 1 && grads.allocated()) return;  // .grad accumulates over micro-batches until the reduction
    const std::string what = fmt::format("unit {} gradients", unit);
    const DType dtype = options_.recipe.grads;
    if (tensorwise_) {
      // One tensor's .grad at a time: each is copied into the bucket by its hook as autograd makes it (the unit's
      // other elements are host scratch until emu copies them at after_backward). The root's largest tensor made
      // at the head (an untied head; the final norm when the head is tied to the embedding, whose .grad autograd
      // makes at the end) is charged apart, when the head's backward makes the first (gradient_made).
      grads = device_.allocate(flat_.count[unit], dtype, Category::kGradients, what,
                               unit == 0 ? 0 : largest_tensor_charge(model_, unit) * dtype_size(dtype));
    } else if (unit == 0) {
      grads = allocate_root_gradients(device_, model_, flat_.count[0], dtype, what);
    } else {
      grads = model::allocate_parameter_space(device_, flat_.unit_charge[unit], flat_.count[unit], dtype,
                                              Category::kGradients, what);
    }
    if (unit == 0) root_charges_.begin(device_, model_, dtype, what);
    model_.bind_grads(unit, grads.data());
  }

  // Autograd made a .grad: DeepSpeed's hook (process_gradients) makes the ipg bucket at the backward's first, the
  // head's or the final norm's, after the loss's backward; stage 1 charges the root's tensors as they are made,
  // stage 2 the head's largest while the root's backward lasts.
  void gradient_made(int unit, size_t offset) override {
    if (buckets_.empty() && !bf16_optimizer()) allocate_buckets();
    if (unit != 0) return;
    if (!tensorwise_) {
      root_charges_.made(offset);
    } else if (!head_grad_.allocated()) {
      const DType dtype = options_.recipe.grads;
      head_grad_ = device_.allocate(0, dtype, Category::kGradients, "the LM head's .grad",
                                    largest_tensor_charge(model_, 0) * dtype_size(dtype));
    }
  }

  // The embeddings' .grad (stage 1: kept until the reduction; stage 2: until emu copies the root into the bucket).
  void before_embedding_backward() override { root_charges_.embeddings_made(); }

  void after_backward(int unit) override {
    if (bf16_optimizer() && unit == 0) accumulate_into_fp32();  // the root is the last unit of every backward
    if (!hooks_reduce_) return;
    // Units finish in decreasing flat order, their tensors last first: the bucket fills from its end backwards.
    const std::vector<model::ParamInfo>& params = model_.layout(unit).params;
    for (auto param = params.rbegin(); param != params.rend(); ++param) reduce_tensor(unit, *param, false);
    release_reduced_gradients(unit);
    if (unit == 0) finish_reduction();  // the root is the last unit of every backward
  }

  void begin_micro_batch(int index, int count) override {
    hooks_reduce_ =
        stage_ == 2 || (stage_ == 1 && options_.zero.overlap_comm && !bf16_optimizer() && index == count - 1);
    tensorwise_ = stage_ == 2 || (hooks_reduce_ && count == 1 && !pending_grads());
  }

  void finish_gradients() override {
    if (hooks_reduce_) return;  // reduced during backward
    if (bf16_optimizer()) {
      all_reduce_fp32();
      return;
    }
    // Stage 1: every tensor in registration order through the ipg bucket; each unit's .grad freed once its last
    // tensor is in the bucket.
    for (int u = 0; u < model_.num_units(); ++u) {
      for (const model::ParamInfo& param : model_.layout(u).params) reduce_tensor(u, param, true);
      release_reduced_gradients(u);
    }
    finish_reduction();
  }

  double gradient_sum_of_squares() override {
    if (!tensor_) {
      return sum_over_world(optim::grad_sum_of_squares(optim::ConstElementSpan::of(grads_)), "clip: gradient norm");
    }
    // Over TP: each tensor's part in this partition, a tensor whole on every TP rank on TP rank 0 only; the sum over
    // the world covers both groups.
    double local = 0;
    for (int u = 0; u < model_.num_units(); ++u) {
      local += tp_shard_sum_of_squares(model_, u, flat_.offset[u], shard_, grads_, tp_group_->rank());
    }
    return sum_over_world(local, "clip: gradient norm");
  }

  void update(double lr, float grad_scale) override {
    const optim::PrecisionRecipe& recipe = options_.recipe;
    optim::ElementSpan params = optim::ElementSpan::of(params_).subspan(shard_.offset, shard_.shard);
    // What AdamW reads: the partition (offload: already fp32 on the host; BF16_Optimizer: its fp32 gradients'; the
    // compact fp32 partition, set as the fp32 partition's .grad as it is) or its copies.
    Buffer step_grads;
    Buffer partition_grads;
    if (pending_grads()) {
      // contiguous_gradients false: step() frees the .grads of the tensors outside the partition
      // (free_grad_in_param_list(params_not_in_partition)); the partition's, its whole tensors, stay to the cast.
      for (int unit = 0; unit < model_.num_units(); ++unit) release_unit_gradients(unit);
      partition_grads = device_.allocate(0, options_.recipe.grads, Category::kGradients,
                                         "ZeRO-1 partition's .grads, kept to step()", partition_charge_);
    }
    if (!offloaded() && !bf16_optimizer() && !compact_partition()) {
      Buffer flat = model::allocate_parameter_space(device_, flat_.charge, shard_.shard, recipe.grads,
                                                    Category::kGradients, "ZeRO flattened gradients");
      convert(grads_.data(), grads_.dtype(), flat.data(), flat.dtype(), shard_.shard);
      if (recipe.has_master && recipe.grads != DType::kF32) {
        step_grads = model::allocate_parameter_space(device_, flat_.charge, shard_.shard, DType::kF32,
                                                     Category::kGradients, "ZeRO fp32 gradient partition");
        convert(flat.data(), flat.dtype(), step_grads.data(), DType::kF32, shard_.shard);
      } else {
        step_grads = std::move(flat);
      }
      // step() frees the partition's .grad (free_grad_in_param_list) and averaged_gradients, grads_in_partition's
      // last views, once they are cast (recorded: the -s8 recordings, which peak here).
      grads_.reset();  // before the inner optimizer steps
      partition_grads.reset();
    }
    const Buffer& read = step_grads.allocated() ? step_grads : grads_;
    {
      // DeepSpeed's FusedAdam makes no temporaries; with torch_adam torch.optim.AdamW steps the fp32 partition, one
      // flat tensor, and makes --adamw's.
      const std::vector<uint64_t> partition = {flat_.charge.elements(shard_.shard)};
      const optim::StepTemporaries temporaries(
          optimizer_device(), options_.zero.torch_adam ? options_.adamw_impl : optim::AdamWImpl::kFused, partition,
          recipe.moments);
      optimizer_->step(options_.adamw, params, optim::ConstElementSpan::of(read), shard_.offset, decay_, lr,
                       grad_scale);
    }
    step_grads.reset();
    if (offloaded()) {
      count_offload(flat_.charge.elements(shard_.shard), dtype_size(grads_.dtype()));
      zero(grads_.data(), grads_.dtype(), grads_.count());
    } else {
      grads_.reset();  // BF16_Optimizer's view of its fp32 gradients; the compact partition, the fp32 .grad until now
    }
    // Every rank's updated shard into every rank's parameters, in all-gather buckets.
    const size_t bucket = options_.scaled(options_.zero.allgather_bucket_elements);
    for (size_t lo = 0, index = 0; lo < shard_.padded; lo += bucket, ++index) {
      const size_t hi = std::min(shard_.padded, lo + bucket);
      const coll::ShardWindow counts = block_counts(lo, hi);
      size_t mine = 0, unused = 0;
      shard_blocks(lo, hi, mine, unused);
      const std::string phase = fmt::format("parameter all-gather, bucket {}", index);
      PhaseScope scope(device_.memory(), phase);
      void* recv = element(params_.data(), recipe.params, lo);
      dp().all_gather_v(element(params_.data(), recipe.params, mine), recv, counts, recipe.params, phase);
    }
    if (bf16_optimizer()) {  // clear_hp_grads; then the engine's zero_grad(set_to_none) drops every bf16 .grad
      zero(hp_grads_.data(), hp_grads_.dtype(), hp_grads_.count());
      for (int unit = 0; unit < model_.num_units(); ++unit) release_unit_gradients(unit);
    }
  }

 private:
  bool offloaded() const { return context_.offload != nullptr; }
  // DeepSpeed's BF16_Optimizer in place of its ZeRO optimizer: bf16 with data_types.grad_accum_dtype fp32 at stage 1
  // (under optimizer offload DeepSpeed keeps its ZeRO optimizer).
  bool bf16_optimizer() const { return stage_ == 1 && options_.zero.fp32_grad_accumulation && !offloaded(); }
  // Stage 2's ZeRO optimizer accumulating in fp32 under bf16 (data_types.grad_accum_dtype "fp32", without offload):
  // its compact fp32 gradient partition (_build_compact_grad_partition_buffer) in place of grads_in_partition.
  bool compact_partition() const { return stage_ == 2 && options_.zero.fp32_grad_accumulation && !offloaded(); }
  // Stage 1 with contiguous_gradients false (ZeroOptions::contiguous_gradients): autograd's .grads wait in the
  // bucket where they were made and are all kept to step(); no bucket buffer, no grads_in_partition.
  bool pending_grads() const {
    return stage_ == 1 && !options_.zero.contiguous_gradients && !offloaded() && !bf16_optimizer();
  }

  // BF16_Optimizer's backward epilogue (update_hp_grads): each tensor's bf16 .grad, in registration order, cast to
  // fp32 (lp.grad.to(fp32): a temporary of that tensor's size) and added into its slice of the fp32 gradients. The
  // bf16 .grad stays; emu zeroes it for the next micro-batch to accumulate into, as the next backward's prologue
  // (clear_lp_grads) does.
  void accumulate_into_fp32() {
    const DType dtype = options_.recipe.grads;
    for (int u = 0; u < model_.num_units(); ++u) {
      Buffer& grads = unit_grads_[static_cast<size_t>(u)];
      if (!grads.allocated()) continue;
      for (const model::ParamInfo& param : model_.layout(u).params) {
        const Buffer cast = device_.allocate(param.count, DType::kF32, Category::kTemporaries,
                                             "a bf16 .grad cast to fp32 (update_hp_grads)",
                                             model::tensor_charge(model_.config(), param) * dtype_size(DType::kF32));
        convert(element(grads.data(), dtype, param.offset), dtype, cast.data(), DType::kF32, param.count);
        accumulate(cast.data(), DType::kF32, element(hp_grads_.data(), DType::kF32, flat_.offset[u] + param.offset),
                   DType::kF32, param.count);
      }
      zero(grads.data(), dtype, grads.count());
    }
  }

  // The engine's allreduce_gradients at the accumulation boundary (buffered_allreduce_fallback): the whole fp32
  // gradient buffer, one flat tensor, cast to the communication dtype (bf16: a copy of it), all-reduced (averaged)
  // over the data-parallel group and copied back. AdamW then reads this rank's partition of it in place
  // (param_partition.grad is a view): emu copies the partition into `grads_`, uncharged, for the norm and the step.
  void all_reduce_fp32() {
    const DType dtype = options_.recipe.grads;
    {
      const std::string phase = "gradient all-reduce, BF16_Optimizer's fp32 gradients";
      PhaseScope scope(device_.memory(), phase);
      Buffer copy = model::allocate_parameter_space(device_, flat_.charge, shard_.padded, dtype, Category::kTemporaries,
                                                    "the fp32 gradients cast for the all-reduce");
      convert(hp_grads_.data(), DType::kF32, copy.data(), dtype, shard_.padded);
      dp().all_reduce(copy.data(), copy.data(), shard_.padded, dtype, coll::ReduceOp::kAvg, phase);
      convert(copy.data(), dtype, hp_grads_.data(), DType::kF32, shard_.padded);
    }
    grads_ = device_.allocate(shard_.shard, DType::kF32, Category::kGradients,
                              "BF16_Optimizer fp32 gradient partition (a view of its fp32 gradients)", 0);
    convert(element(hp_grads_.data(), DType::kF32, shard_.offset), DType::kF32, grads_.data(), DType::kF32,
            shard_.shard);
  }

  // The group DeepSpeed partitions over: the data-parallel group of this TP slice, the world without --tp.
  coll::Communicator& dp() const { return dp_group_ ? *dp_group_ : world_; }

  // DeepSpeed's bucket is reduce_bucket_size elements even when the whole flat group is smaller (a small model at
  // k = 1): it is charged at that size, but only the part a range can reach, up to P, is backed by host memory.
  // The size is already full scale ÷ k² (StrategyOptions::scaled), so a shrunk run charges the bucket as it holds it.
  void allocate_buckets() {
    const size_t backed = std::min(bucket_capacity_, shard_.padded);
    // contiguous_gradients false: DeepSpeed keeps no bucket buffer (the .grads wait where autograd made them); emu's
    // is host scratch then, charged nothing.
    const size_t charged = pending_grads() ? 0 : bucket_capacity_ * dtype_size(options_.recipe.grads);
    for (int i = 0; i < (options_.zero.overlap_comm ? 2 : 1); ++i) {
      buckets_.push_back(device_.allocate(backed, options_.recipe.grads, Category::kBuckets,
                                          fmt::format("ZeRO-{} reduce bucket {}", stage_, i), charged));
    }
  }

  void free_buckets() {
    buckets_.clear();
    current_bucket_ = 0;
  }

  // One tensor of `unit` into the bucket, or, larger than the bucket, reduced from the unit's gradients
  // (DeepSpeed's extra_large_param_to_reduce).
  void reduce_tensor(int unit, const model::ParamInfo& param, bool ascending) {
    if (buckets_.empty()) allocate_buckets();  // no .grad made this backward: made for the reduction
    const size_t begin = flat_.offset[unit] + param.offset;
    const size_t end = begin + param.count;
    if (param.count <= bucket_capacity_) {
      add_to_bucket(unit, begin, end, ascending);
      ++bucket_tensors_;
      bucket_charged_ += model::tensor_charge(model_.config(), param);
      return;
    }
    flush_bucket();
    reduce_into_partition(element(unit_grads_[static_cast<size_t>(unit)].data(), options_.recipe.grads, param.offset),
                          begin, end, fmt::format("gradient all-reduce, tensor at flat element {}", begin));
  }

  // The last bucket reduced; the buckets freed (DeepSpeed's _release_ipg_buffers in the reduce epilogue), and with
  // them a later micro-batch's own partition, added into the accumulated one.
  void finish_reduction() {
    flush_bucket();
    free_buckets();
    micro_partition_.reset();
    reduced_this_backward_ = false;
  }

  // A unit's .grad once its tensors are reduced; contiguous_gradients false keeps every .grad to step().
  void release_reduced_gradients(int unit) {
    if (!pending_grads()) release_unit_gradients(unit);
  }

  void release_unit_gradients(int unit) {
    model_.bind_grads(unit, nullptr);
    unit_grads_[static_cast<size_t>(unit)].reset();
    if (unit != 0) return;
    root_charges_.reset();
    head_grad_.reset();
  }

  // How many elements of [lo, hi) each rank's shard holds: the reduce-scatter and all-gather blocks. Every rank's
  // shard is shard_.shard elements at r·shard_.shard (shard_of), so the blocks are a window over equal shards,
  // known per rank without a pass over the world.
  coll::ShardWindow block_counts(size_t lo, size_t hi) const { return {shard_.shard, lo, hi}; }
  // This rank's block of [lo, hi), in flat coordinates (padding included).
  void shard_blocks(size_t lo, size_t hi, size_t& begin, size_t& end) const {
    begin = std::clamp(shard_.offset, lo, hi);
    end = std::clamp(shard_.offset + shard_.shard, lo, hi);
  }

  // Reduces (averages) flat range [lo, hi), held at `data`, in place, and adds this rank's block to its gradient
  // partition (stage 1 makes the partition at its first reduction, as DeepSpeed's copy_grads_in_partition does).
  // DeepSpeed 0.19's average_tensor, at its defaults (reduce_scatter and use_multi_rank_bucket_allreduce on), cuts the
  // range into one slice per owner and all-reduces them together (allreduce_and_scatter -> allreduce_bucket); each
  // rank then copies its own slice back. So every bucket moves an all-reduce's bytes, not a reduce-scatter's
  // (recorded: the collectives of the DeepSpeed recordings, the gradients in all-reduces of 2Ψ bytes in all at stages
  // 1 and 2). With use_multi_rank_bucket_allreduce false each owner's slice is reduced to it instead
  // (reduce_to_owners; recorded: llama-zero{1,2}-bf16-rbs20000-reduce-n2.json, reduces of 2Ψ bytes in all). Not
  // charged: where the range crosses a shard boundary (several slices) allreduce_bucket flattens them into a new [hi -
  // lo] tensor for the all-reduce (one owner's slice is reduced in place); emu packs its buckets in unit order, not
  // DeepSpeed's registration order, so its crossing ranges are not DeepSpeed's.
  void reduce_into_partition(void* data, size_t lo, size_t hi, const std::string& phase) {
    const DType dtype = options_.recipe.grads;
    if (!grads_.allocated() && compact_partition()) {
      grads_ = model::allocate_parameter_space(device_, flat_.charge, shard_.shard, DType::kF32, Category::kGradients,
                                               "ZeRO-2 compact fp32 gradient partition");
    } else if (!grads_.allocated()) {  // on the device, the step's first reduction
      // contiguous_gradients false: no grads_in_partition; the partition's own .grads hold it (charged with them).
      grads_ =
          device_.allocate(shard_.shard, dtype, Category::kGradients, fmt::format("ZeRO-{} gradient partition", stage_),
                           pending_grads() ? 0 : partition_charge_);
    } else if (stage_ == 2 && !reduced_this_backward_ && !offloaded() && !compact_partition()) {
      // A later micro-batch: copy_grads_in_partition makes a new grads_in_partition while all_grad_tensors keeps
      // views of the accumulated one; the epilogue adds it in and drops it. Each of its elements is written once, so
      // adding the reduced blocks straight into the accumulated partition is the same sum.
      micro_partition_ = device_.allocate(0, dtype, Category::kGradients, "ZeRO-2 gradient partition, this micro-batch",
                                          partition_charge_);
    }
    reduced_this_backward_ = true;
    size_t begin = 0, end = 0;
    shard_blocks(lo, hi, begin, end);
    {
      PhaseScope scope(device_.memory(), phase);
      if (options_.zero.multi_rank_bucket_allreduce || pending_grads()) {  // buffered_reduce_fallback: all-reduced
        dp().all_reduce(data, data, hi - lo, dtype, coll::ReduceOp::kAvg, phase);
      } else {
        reduce_to_owners(data, lo, hi, phase);
      }
    }
    if (end > begin) {  // this rank's shard meets the range
      accumulate(element(data, dtype, begin - lo), dtype, element(grads_.data(), grads_.dtype(), begin - shard_.offset),
                 grads_.dtype(), end - begin);
    }
  }

  // use_multi_rank_bucket_allreduce false: each owner's slice of [lo, hi), held at `data`, reduced (averaged) to that
  // owner in place (average_tensor's ("reduce", dst) buckets, allreduce_no_retain -> dist.reduce), in the order the
  // bucket was filled: ascending flat order after backward, descending when the hooks reduce in backward. Only the
  // owner's slice holds the sum.
  void reduce_to_owners(void* data, size_t lo, size_t hi, const std::string& phase) {
    const DType dtype = options_.recipe.grads;
    const int first = static_cast<int>(lo / shard_.shard);
    const int last = static_cast<int>((hi - 1) / shard_.shard);
    for (int i = 0; i <= last - first; ++i) {
      const int owner = hooks_reduce_ ? last - i : first + i;
      const size_t begin = std::max(lo, static_cast<size_t>(owner) * shard_.shard);
      const size_t end = std::min(hi, static_cast<size_t>(owner + 1) * shard_.shard);
      void* slice = element(data, dtype, begin - lo);
      dp().reduce(slice, slice, end - begin, dtype, coll::ReduceOp::kAvg, owner, phase);
    }
  }

  // Copies flat range [begin, end) of `unit`'s gradients into the bucket, flushing it first when the range does not
  // continue the bucket's contiguous range or does not fit. Ranges arrive in increasing (after backward) or decreasing
  // (in backward: stage 2, stage 1 with overlap_comm) flat order; the bucket's range sits at its start or at its end
  // accordingly.
  void add_to_bucket(int unit, size_t begin, size_t end, bool ascending) {
    const bool empty = bucket_lo_ == bucket_hi_;
    const bool continues = ascending ? begin == bucket_hi_ : end == bucket_lo_;
    if (!empty && (!continues || std::max(end, bucket_hi_) - std::min(begin, bucket_lo_) > bucket_capacity_)) {
      flush_bucket();
    }
    if (bucket_lo_ == bucket_hi_) {
      bucket_ascending_ = ascending;
      bucket_lo_ = begin;
      bucket_hi_ = end;
    } else {
      bucket_lo_ = std::min(begin, bucket_lo_);
      bucket_hi_ = std::max(end, bucket_hi_);
    }
    const DType dtype = options_.recipe.grads;
    const void* source = element(unit_grads_[static_cast<size_t>(unit)].data(), dtype, begin - flat_.offset[unit]);
    convert(source, dtype, bucket_at(begin), dtype, end - begin);
  }

  void* bucket_at(size_t flat_index) {
    Buffer& bucket = buckets_[current_bucket_];
    const size_t at = bucket_ascending_ ? flat_index - bucket_lo_ : bucket.count() - (bucket_hi_ - flat_index);
    return element(bucket.data(), bucket.dtype(), at);
  }

  // Reduces the bucket's range (reduce_into_partition); this rank adds its block to its partition.
  void flush_bucket() {
    if (bucket_lo_ == bucket_hi_) return;
    Buffer flattened;  // contiguous_gradients false: allreduce_bucket flattens a bucket of several pending .grads
    if (pending_grads() && bucket_tensors_ > 1) {
      flattened = device_.allocate(0, options_.recipe.grads, Category::kBuckets, "ZeRO-1 bucket, flattened",
                                   bucket_charged_ * dtype_size(options_.recipe.grads));
    }
    bucket_tensors_ = 0;
    bucket_charged_ = 0;
    reduce_into_partition(
        bucket_at(bucket_lo_), bucket_lo_, bucket_hi_,
        fmt::format("{} all-reduce, units from flat element {}", stage_ == 1 ? "gradient" : "backward", bucket_lo_));
    bucket_lo_ = bucket_hi_ = 0;
    current_bucket_ = (current_bucket_ + 1) % buckets_.size();
  }

  int stage_;
  FlatLayout flat_;
  ShardInfo shard_;
  Buffer params_;  // [P] recipe.params, every unit whole
  Buffer grads_;   // [S] this rank's gradient partition, charged as its whole tensors, from the step's first
                   // reduction to step (offload: fp32, host, all run)
  std::vector<Buffer> buckets_;         // [R] each, from the first gradient hook to the end of the reduction
  Buffer staging_;                      // offload: [largest tensor] recipe.grads
  Buffer hp_grads_;                     // BF16_Optimizer: [P] fp32, all run
  size_t partition_charge_ = 0;         // bytes charged for a partition on the device: its whole tensors
  Buffer micro_partition_;              // stage 2, charged only: a later micro-batch's, to its backward's end
  bool reduced_this_backward_ = false;  // this backward has reduced into the partition
  // This backward's gradient hooks reduce (stage 2; stage 1 with overlap_comm at the accumulation boundary), and
  // copy each .grad into the bucket as autograd makes it (stage 2; stage 1 so when the boundary is the only
  // micro-batch: no .grad accumulated before it).
  bool hooks_reduce_;
  bool tensorwise_;
  std::vector<Buffer> unit_grads_;        // [n_u]: stage 1 from backward to the reduction; stage 2 during u's backward
  RootGradientCharges root_charges_;      // charged only: the root's .grad as made (stage 2: its embeddings' only)
  Buffer head_grad_;                      // stage 2, charged only: the head's .grad (tied: until the end)
  size_t bucket_capacity_ = 0;            // R
  size_t bucket_lo_ = 0, bucket_hi_ = 0;  // flat range held by the current bucket
  bool bucket_ascending_ = false;         // the range sits at the bucket's start (else at its end)
  size_t current_bucket_ = 0;
  size_t bucket_tensors_ = 0;  // tensors in the current bucket
  size_t bucket_charged_ = 0;  // their elements as a shrunk run charges them
  std::vector<optim::DecayRange> decay_;
  std::unique_ptr<optim::AdamWState> optimizer_;
  std::unique_ptr<coll::Communicator> tp_group_, dp_group_;  // --tp T ≥ 2 (setup)
  std::unique_ptr<GroupTensorParallel> tensor_;              // the model's view of the TP group
  std::vector<std::vector<std::vector<int64_t>>> index_;  // [units][params][local elements]: the full element or −1
};

}  // namespace

std::unique_ptr<Strategy> make_zero12(StrategyContext context, const StrategyOptions& options, int stage) {
  return std::make_unique<PartitionedOptimizer>(context, options, stage);
}

}  // namespace emu::strategy
