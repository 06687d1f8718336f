// ZeRO-1 and ZeRO-2's predicted memory and traffic (zero12.cpp runs them, as DeepSpeed 0.19's
// stage_1_and_2.py), after the ZeRO paper's (2 + 2 + K/N)Ψ and (2 + (2 + K)/N)Ψ plus DeepSpeed's buffers.
//
// The flat space of Ψ parameters is padded to P, a multiple of 2N (DeepSpeed's nccl_start_alignment_factor), and
// cut into shards of S = P/N. Per rank:
//   stage 1  parameters P · parameter bytes
//            gradients: every tensor's .grad (Ψ · gradient bytes) at the end of backward, or, when the gradient
//            partition (W, made at the first reduction) arrives before F elements of .grad are freed,
//            (Ψ − F + W) · gradient bytes: F is the units wholly copied into the ipg bucket when it first fills
//            (tensors in registration order, a tensor larger than the bucket reduced from its own storage)
//            reduce bucket R · gradient bytes (two with overlap_comm), R = reduce_bucket_size elements
//            with overlap_comm the boundary's backward reduces: F counts the units in backward order, and with one
//            micro-batch the gradients are stage 2's (one .grad at a time, backward_gradients)
//            contiguous_gradients false: every .grad (Ψ · gradient bytes) kept to step(), no bucket buffer and no
//            partition in backward; buckets: the largest bucket of several tensors, flattened for its all-reduce
//   stage 2  parameters P · parameter bytes   gradients: the .grad autograd makes before DeepSpeed's hook copies
//            it into the bucket, one tensor at a time, beside the partition (W · gradient bytes) once the
//            backward's first reduction has made it, and over accumulated micro-batches beside the first one's
//            partition and a later one's own (backward_gradients)
//            reduce bucket R · gradient bytes (two with overlap_comm), R = reduce_bucket_size elements
//   both     master weights and Adam moments over the S elements this rank updates
//            the step: the partition, its flattened copy and, in the mixed recipe, its fp32 copy at once
//            (W · gradient bytes + S · (gradient bytes + 4)), when that is more than backward's gradients
//   W: the gradient partition (DeepSpeed's grads_in_partition) holds the whole of every tensor that meets this
//            rank's S elements, in registration order (shard.h whole_tensors_meeting): ranks differ, and a plan
//            accounts the one holding the most (analytic.h representative_rank)
//   compact  (fp32_grad_accumulation, stage 2 without offload): the partition is S · 4 (fp32) from the first
//            reduction, the one sum over the micro-batches, and step() reads it as it is (no step copies)
//   BF16_Optimizer (fp32_grad_accumulation, stage 1 without offload): parameters P · parameter bytes, gradients
//            every unit's .grad (Ψ · gradient bytes) beside the fp32 gradients of the whole group (P · 4), no reduce
//            bucket and no step copies; an all-reduce of P · gradient bytes instead of the reduce-scatter
//   offload  the gradient partition in host memory at fp32 (S · 4, sent down every step), not on the device; the
//            device adds a staging buffer of the largest tensor (kBuckets)
// Each buffer sized in parameter elements is charged as a shrunk run charges it (AnalyticInput::bytes: norm
// weights and biases ÷ k); R, reduce_bucket_size ÷ k², is charged as held.
// Traffic per step: the gradients all-reduced in slices per owner, as DeepSpeed 0.19's average_tensor reduces them
// (Ψ, padding never reduced: stage 1 once, after the last micro-batch; stage 2 every micro-batch), or with
// use_multi_rank_bucket_allreduce false reduced to their owners (each rank sends all but its own slices), the updated
// shards all-gathered (P), the gradient norm all-reduced.
// Over tensor-parallel layers (--tp T): the input's units are the rank's TP slice (Ψ/T plus its padding rows of
// the vocabulary), N reads D = N/T and the traffic above is the "data-parallel" group's; tp's activation
// all-reduces are the "tensor-parallel" group's; the gradient norm is all-reduced over the world.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "strategies/analytic.h"
#include "strategies/shard.h"

namespace emu::strategy {
namespace {

// The unit the reductions reach at `step`: in registration order (units 0, 1, ...) after backward; in backward, as
// each unit's backward ends: blocks L..1, then the root (whose tensors, like every unit's, go in last first).
size_t unit_reduced_at(size_t step, size_t units, bool in_backward) {
  if (!in_backward) return step;
  return step + 1 < units ? units - 1 - step : 0;
}

// Stage 1: the .grad bytes still alive when the first reduction happens, out of `every_grad`. The tensors go into the
// bucket unit by unit: in registration order after backward, or, reduced in the accumulation boundary's backward
// (overlap_comm, `in_backward`), as each unit's backward ends (blocks L..1, then the root, each unit's tensors last
// first). A unit's .grad is freed once all its tensors are in; the reduction comes when a tensor does not fit (or is
// larger than the bucket), with its unit's .grad alive, or after every .grad was copied (none alive).
template <typename UnitGrad>
uint64_t grads_alive_at_first_reduction(const AnalyticInput& input, uint64_t bucket, bool in_backward,
                                        uint64_t every_grad, UnitGrad unit_grad) {
  const size_t units = input.unit_counts.size();
  uint64_t in_bucket = 0;
  uint64_t freed = 0;
  for (size_t step = 0; step < units; ++step) {
    const size_t unit = unit_reduced_at(step, units, in_backward);
    std::vector<uint64_t> tensors = input.tensors_of(unit);
    if (in_backward) std::reverse(tensors.begin(), tensors.end());
    for (uint64_t tensor : tensors) {
      if (tensor > bucket || in_bucket + tensor > bucket) return every_grad - freed;
      in_bucket += tensor;
    }
    freed += unit_grad(unit);
  }
  return 0;  // the one reduction comes after every .grad was copied
}

// Stage 1 with contiguous_gradients false: the largest bucket of several tensors, in elements as a shrunk run charges
// them, packed in the order above; allreduce_bucket flattens such a bucket's pending .grads into a new tensor (a
// tensor larger than the bucket, or alone in it, is all-reduced where it is).
uint64_t largest_flattened_bucket(const AnalyticInput& input, uint64_t bucket, bool in_backward) {
  const size_t units = input.unit_counts.size();
  uint64_t largest = 0, in_bucket = 0, charged = 0, tensors_in = 0;
  const auto flush = [&] {
    if (tensors_in > 1) largest = std::max(largest, charged);
    in_bucket = charged = tensors_in = 0;
  };
  for (size_t step = 0; step < units; ++step) {
    const size_t unit = unit_reduced_at(step, units, in_backward);
    std::vector<uint64_t> tensors = input.tensors_of(unit);
    std::vector<uint64_t> charges =
        unit < input.unit_tensors_charged.size() ? input.unit_tensors_charged[unit] : tensors;
    if (in_backward) {
      std::reverse(tensors.begin(), tensors.end());
      std::reverse(charges.begin(), charges.end());
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i] > bucket) {
        flush();
        continue;
      }
      if (in_bucket + tensors[i] > bucket) flush();
      in_bucket += tensors[i];
      charged += charges[i];
      ++tensors_in;
    }
  }
  flush();
  return largest;
}

// Stage 2: the most gradient bytes alive at once in backward. DeepSpeed's hook copies each .grad into the bucket as
// autograd makes it, so one tensor's lives at a time (as a shrunk run charges it): the LM head's in the head's
// backward (a head tied to the embedding makes none there: autograd keeps its part as a temporary and makes the
// table's .grad at the end, model.h), a block's largest in its backward, the embeddings' at the end. The gradient
// partition (`partition` bytes) is made by the backward's first reduction: a unit's tensors, last first, go into
// the bucket when its backward ends (blocks L..1, then the root), and the bucket is reduced when the next tensor
// does not fit (a tensor larger than the bucket is reduced from its own storage), with that unit's .grad still
// alive, or at the end, after the root's is freed. With accumulation the first micro-batch's partition stays
// through the later ones, each of which makes its own at its first reduction, to its end (zero12.cpp).
// A compact fp32 partition (`one_partition`) is the one sum over the micro-batches: no later one beside it.
uint64_t backward_gradients(const AnalyticInput& input, uint64_t bucket, uint64_t grad_bytes, uint64_t partition,
                            bool one_partition) {
  const size_t units = input.unit_counts.size();
  const auto largest = [&](size_t unit) {
    const bool known = unit < input.unit_tensors_charged.size();
    const std::vector<uint64_t> tensors = known ? input.unit_tensors_charged[unit] : input.tensors_of(unit);
    return *std::max_element(tensors.begin(), tensors.end()) * grad_bytes;
  };
  const bool several = input.accumulation > 1;
  const uint64_t kept = several ? partition : 0;  // the accumulated partition, through a later micro-batch
  // What this micro-batch's first reduction makes: the partition, or beside the accumulated one a later micro-batch's
  // own (none for the compact one).
  const uint64_t made = several && one_partition ? 0 : partition;
  // The head's .grad comes before any reduction.
  uint64_t peak = std::max(input.root_head_tensor() * grad_bytes + kept, several ? kept + made : 0);
  uint64_t in_bucket = 0;
  bool reduced = false;
  for (size_t step = 0; step < units; ++step) {  // blocks L..1, then the root (its .grad: the embeddings')
    const size_t unit = unit_reduced_at(step, units, true);
    const std::vector<uint64_t> tensors = input.tensors_of(unit);
    for (auto tensor = tensors.rbegin(); tensor != tensors.rend(); ++tensor) {
      if (*tensor > bucket) {
        reduced = true;  // the bucket (if any) and the tensor itself
        in_bucket = 0;
      } else if (in_bucket + *tensor > bucket) {
        reduced = true;
        in_bucket = *tensor;
      } else {
        in_bucket += *tensor;
      }
    }
    const uint64_t grad = unit == 0 ? input.root_embedding_elements() * grad_bytes : largest(unit);
    peak = std::max(peak, grad + kept + (reduced ? made : 0));
  }
  return peak;
}

}  // namespace

Updated predict_zero12(const StrategyOptions& options, const AnalyticInput& input, int stage, Prediction& prediction) {
  const Mesh mesh = mesh_of(options, input.world, input.rank);
  const int world = mesh.data;  // the ranks DeepSpeed partitions over
  const std::string group = mesh.tensor > 1 ? "data-parallel" : "world";
  if (mesh.tensor > 1) add_tensor_parallel_traffic(prediction, input, "tensor-parallel", mesh.tensor);
  const uint64_t parameters = input.parameter_count();
  const uint64_t padded_parameters = shard_of(parameters, 0, world, kNcclStartAlignment).padded;
  const uint64_t shard_elements = padded_parameters / world;
  const uint64_t grad_bytes = dtype_size(options.recipe.grads);
  const DType grads = options.recipe.grads;
  const int all = AnalyticInput::kAllUnits;
  const uint64_t buffers = options.zero.overlap_comm ? 2 : 1;
  // reduce_bucket_size is already full scale ÷ k²: the bucket is charged as it is held.
  const uint64_t bucket_elements = options.scaled(options.zero.reduce_bucket_elements);
  prediction.peak[Category::kParameters] = input.bytes(all, padded_parameters, options.recipe.params);
  prediction.peak[Category::kBuckets] = bucket_elements * grad_bytes * buffers;
  // Under offload the partition is on the host: none on the device. On the device it is sized for the whole tensors
  // that meet this rank's S elements (shard.h whole_tensors_meeting); step()'s flattened copy is S.
  const std::vector<uint64_t> order = input.registration_order();
  const uint64_t whole = whole_tensors_meeting(order, group_shard(order, world, kNcclStartAlignment),
                                               static_cast<uint64_t>(mesh.data_rank()));
  // Stage 2 accumulating in fp32 under bf16 keeps a compact fp32 partition of S elements instead.
  const bool compact = stage == 2 && options.zero.fp32_grad_accumulation && !input.offload;
  const uint64_t device_partition = input.offload ? 0
                                    : compact     ? input.bytes(all, shard_elements, DType::kF32)
                                                  : input.bytes(AnalyticInput::kCharged, whole, grads);
  const auto unit_grad = [&](size_t unit) {  // the unit's .grad, as a shrunk run charges it
    return input.bytes(static_cast<int>(unit), input.unit_counts[unit], grads);
  };
  uint64_t every_grad = 0;  // every unit's .grad at the end of backward
  for (size_t unit = 0; unit < input.unit_counts.size(); ++unit) every_grad += unit_grad(unit);
  const bool bf16_optimizer = stage == 1 && options.zero.fp32_grad_accumulation && !input.offload;
  const bool pending_grads = stage == 1 && !options.zero.contiguous_gradients && !input.offload && !bf16_optimizer;
  // The ZeRO optimizer's buckets: all-reduced (contiguous_gradients false: whole, buffered_reduce_fallback), or each
  // owner's slices reduced to it (use_multi_rank_bucket_allreduce false; a ring reduce sends (N−1)/N of the payload
  // per rank on average: each rank all of it but its own slices).
  const coll::CollectiveKind gradient_reduction = options.zero.multi_rank_bucket_allreduce || pending_grads
                                                      ? coll::CollectiveKind::kAllReduce
                                                      : coll::CollectiveKind::kReduce;
  if (bf16_optimizer) {
    // BF16_Optimizer: every bf16 .grad, from the end of backward to the step, beside the fp32 gradients of the whole
    // flat group (all run); no reduce bucket; the fp32 gradients all-reduced in bf16 (a copy: a temporary); AdamW
    // reads its partition of them in place.
    prediction.peak[Category::kGradients] = every_grad + input.bytes(all, padded_parameters, DType::kF32);
    prediction.peak[Category::kBuckets] = 0;
    prediction.formula =
        "(2 + 2 + 4 + K/N)Ψ: BF16_Optimizer, fp32 gradients of every parameter, optimizer state "
        "partitioned";
    add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, group, padded_parameters * grad_bytes, world);
  } else if (pending_grads) {
    // contiguous_gradients false: every .grad kept to step(), each bucket of several flattened for its all-reduce;
    // no bucket buffer and no grads_in_partition (the partition's .grads, W, stay to step()'s cast).
    prediction.peak[Category::kGradients] = every_grad;
    prediction.peak[Category::kBuckets] =
        largest_flattened_bucket(input, bucket_elements, options.zero.overlap_comm) * grad_bytes;
  } else if (stage == 1 && options.zero.overlap_comm && input.accumulation == 1) {
    // With overlap_comm the gradient hooks reduce in the boundary's backward; the only micro-batch's .grads go into
    // the bucket one tensor at a time, as at stage 2.
    prediction.peak[Category::kGradients] =
        backward_gradients(input, bucket_elements, grad_bytes, device_partition, false);
  } else if (stage == 1) {
    // Every .grad accumulated to the boundary, then copied into the bucket (after backward; with overlap_comm in
    // the boundary's backward) and freed unit by unit, the partition made by the first reduction.
    const uint64_t kept_grad =
        grads_alive_at_first_reduction(input, bucket_elements, options.zero.overlap_comm, every_grad, unit_grad);
    prediction.peak[Category::kGradients] = std::max(every_grad, kept_grad + device_partition);
  } else {
    prediction.peak[Category::kGradients] =
        backward_gradients(input, bucket_elements, grad_bytes, device_partition, compact);
    prediction.formula = "(2 + (2 + K)/N)Ψ: optimizer state and gradients partitioned";
    add_ring_traffic(prediction, gradient_reduction, group, parameters * grad_bytes, world,
                     static_cast<uint64_t>(input.accumulation));
  }
  if (stage == 1 && !bf16_optimizer) {  // the ZeRO optimizer's reduction, once a step
    prediction.formula = "(2 + 2 + K/N)Ψ: optimizer state partitioned";
    add_ring_traffic(prediction, gradient_reduction, group, parameters * grad_bytes, world);
  }
  // DeepSpeed's step(): flatten(averaged_gradients).to(fp32) beside the partition (BF16_Optimizer's reads its fp32
  // gradients in place)
  if (!input.offload && !bf16_optimizer && !compact) {
    const bool cast = options.recipe.has_master && grads != DType::kF32;
    const uint64_t at_step = device_partition + input.bytes(all, shard_elements, grads) +
                             (cast ? input.bytes(all, shard_elements, DType::kF32) : 0);
    prediction.peak[Category::kGradients] = std::max(prediction.peak[Category::kGradients], at_step);
  } else if (input.offload) {
    uint64_t largest_tensor = 0;
    for (size_t unit = 0; unit < input.unit_counts.size(); ++unit) {
      for (uint64_t tensor : input.tensors_of(unit)) largest_tensor = std::max(largest_tensor, tensor);
    }
    const uint64_t staging = input.largest_tensor_charged != 0 ? input.largest_tensor_charged : largest_tensor;
    prediction.peak[Category::kBuckets] += staging * grad_bytes;
    prediction.host_peak[Category::kGradients] = input.bytes(all, shard_elements, DType::kF32);
    prediction.pcie.device_to_host = prediction.host_peak[Category::kGradients];
  }
  if (options.zero.torch_adam) {  // torch.optim.AdamW over the one flat fp32 partition (FusedAdam: none)
    const uint64_t partition = input.elements(all, shard_elements);
    if (options.adamw_impl == optim::AdamWImpl::kForeach) prediction.step_temporary_elements = partition;
    if (options.adamw_impl == optim::AdamWImpl::kSingle) prediction.step_temporary_elements = 2 * partition;
  }
  add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, group,
                   padded_parameters * dtype_size(options.recipe.params), world);
  add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "world", 4,
                   input.world);  // the gradient norm's partial sums
  if (mesh.tensor > 1) {
    prediction.formula =
        fmt::format("{}, over the TP slice (Ψ/t, t = {}) with N = D = {}", prediction.formula, mesh.tensor, mesh.data);
  }
  return {{all, shard_elements}};
}

}  // namespace emu::strategy
