// Helpers every strategy shares for the model's flat unit buffers: where each unit sits in the concatenation of
// all units, which elements get weight decay, initial values, and element-wise copies between dtypes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/communicator.h"
#include "emu/device.h"
#include "strategies/shard.h"
#include "workloads/model/model.h"
#include "workloads/model/shrink.h"
#include "workloads/model/tensor_parallel.h"
#include "workloads/optim/adamw.h"

namespace emu::strategy {

// All units back to back in unit order (root, block 1, ..., block L): the flat space ZeRO-1/2 partition.
struct FlatLayout {
  std::vector<size_t> offset;  // [units] first element of each unit
  std::vector<size_t> count;   // [units]
  size_t total = 0;            // Ψ
  // How a shrunk run charges elements of the whole space, and of each unit (norm weights and biases ÷ k).
  model::ParameterCharge charge;
  std::vector<model::ParameterCharge> unit_charge;  // [units]
};
FlatLayout flat_layout(const model::Model& model);
// How a shrunk run charges elements of `unit`'s flat space (workloads/model/shrink.h).
model::ParameterCharge unit_charge(const model::Model& model, int unit);

// The largest of `unit`'s tensors as a shrunk run charges it (model::tensor_charge); for the root, of those whose
// gradients autograd makes at the head, after the loss's backward (the LM head's, the final norm's; not the token
// table's, made at the end: model/layout.h gradient_made_at_end).
uint64_t largest_tensor_charge(const model::Model& model, int unit);
// The index of the parameter of `unit`'s layout that holds element `offset` (an internal error when none does).
size_t param_holding(const model::Model& model, int unit, size_t offset);

// The root's gradients as autograd makes them (model/layout.h gradient_made_at_end): the LM head's (untied) and the
// final norm's when the head's backward reaches them, after the loss's backward (model.h Hooks::gradient_made with
// unit 0), the embeddings' when backward reaches them, last. The model accumulates the root's gradients into one
// flat buffer, so a strategy allocates that buffer whole at before_backward(0), charged only for any padding past
// the root's tensors (allocate_root_gradients), and charges the tensors as they are made (RootGradientCharges),
// freeing both together.
// The embeddings' part in elements, as a shrunk run charges them.
uint64_t root_embedding_charge(const model::Model& model);
// The root's gradient buffer of `count` elements (n_0, or n_0 padded for sharding) at `dtype`, charged as
// allocate_parameter_space charges it less the root's tensors (RootGradientCharges charges those).
Buffer allocate_root_gradients(Device& device, const model::Model& model, size_t count, DType dtype,
                               std::string_view what);
// The charges of the root's gradient tensors as autograd makes them, holding nothing (the data is in the buffer
// allocate_root_gradients made). Each tensor is charged once until reset(), so a gradient kept over micro-batches is
// charged once.
class RootGradientCharges {
 public:
  // Starts charging `model`'s root gradients at `dtype`, named after `what`; nothing is charged yet. Again while
  // started: nothing.
  void begin(Device& device, const model::Model& model, DType dtype, std::string_view what);
  bool begun() const { return device_ != nullptr; }
  // The root tensor holding element `offset` of the root's layout is made (Hooks::gradient_made(0, offset)): charges
  // it, unless autograd makes it at the end (embeddings_made charges those).
  void made(size_t offset);
  // Backward reaches the embeddings: charges the tensors made there (root_embedding_charge), named "{what},
  // embeddings".
  void embeddings_made();
  void reset();

 private:
  Device* device_ = nullptr;
  const model::Model* model_ = nullptr;
  DType dtype_ = DType::kF32;
  std::string what_;
  std::vector<Buffer> tensors_;  // [root parameters] made at the head, charged, holding nothing
  Buffer embeddings_;            // the tensors made at the end, charged together
};

// A block's gradients as autograd makes them under DDP and FSDP2 (one .grad per parameter, made by AccumulateGrad
// when backward reaches the op that reads the parameter: model.h Hooks::gradient_made), not the block's at once.
// The model accumulates a block's gradients into one flat buffer, so the strategy allocates that buffer whole when
// the block's backward begins, charged nothing, and charges each tensor (as a shrunk run charges it,
// model::tensor_charge) when its gradient is made; reset() frees them together (zero_grad(set_to_none=True), or
// the strategy's reduce).
class BlockGradients {
 public:
  // The unit's flat buffer at `dtype`, nothing charged yet.
  void allocate(Device& device, const model::Model& model, int unit, DType dtype, std::string_view what);
  // The tensor holding element `offset` of the unit's layout is made: charges it, once (a fused tensor is reported
  // once per row block).
  void made(size_t offset);
  // Checks that every tensor was made: the block's backward is over.
  void check_complete() const;
  bool allocated() const { return buffer_.allocated(); }
  void* data() { return buffer_.data(); }
  void reset();

 private:
  Device* device_ = nullptr;
  const model::Model* model_ = nullptr;
  int unit_ = 0;
  DType dtype_ = DType::kF32;
  std::string what_;
  Buffer buffer_;
  std::vector<Buffer> tensors_;  // [parameters of the unit] charged, holding nothing; unallocated until made
};

// The elements of `layout` that receive weight decay, shifted by `base` (sorted, non-overlapping).
std::vector<optim::DecayRange> decay_ranges(const model::UnitLayout& layout, size_t base);

// Initial fp32 values of elements [begin, begin + count) of `unit` (the same on every rank, whatever the split),
// stored into `out` at `dtype`. Nothing when out is null (shapes-only device).
void init_into(const model::Model& model, int unit, uint64_t seed, size_t begin, size_t count, void* out, DType dtype);

// Tensor parallelism's slice of a unit (tp, and pp's tensor-parallel stages), on a model run under
// Model::set_tensor_parallel: for each of the unit's local tensors, the element of the full tensor each of its
// elements holds, or −1 for vocabulary padding (model::tensor_parallel_index) for TP rank `rank` of `size`.
std::vector<std::vector<int64_t>> tp_slice_index(const model::Model& model, int unit, int rank, int size);
// The slice's initial fp32 values (padding rows 0) from the full unit's seeded initialisation.
void init_tp_slice(const model::Model& model, int unit, uint64_t seed, const std::vector<std::vector<int64_t>>& index,
                   float* out);
// Adds the slice `local` (fp32, the unit's local layout) into `full` (the full layout) at its elements; tensors held
// whole by every TP rank (norm weights) only where `replicated_too`, so that a sum over the group counts them once.
void place_tp_slice(const model::Model& model, int unit, const std::vector<std::vector<int64_t>>& index,
                    const float* local, bool replicated_too, float* full);

// Whether tensor `param` of `unit` is held whole by every TP rank (norm weights, GPT-2's row-parallel biases and
// wpe): its gradient is the same on every TP rank and counts once in the gradient norm.
bool tp_replicated(const model::Model& model, int unit, size_t param);

// Σ g² of gradient buffer `grads`, which holds flat elements [shard.offset, shard.offset + shard.shard) of a flat
// space where unit `unit`'s tensors begin at element `unit_offset`, over the unit's tensors in that range, each tensor
// every TP rank holds whole (tp_replicated) counted on TP rank 0 only (`tp_rank`): DeepSpeed's get_grad_norm_direct
// counts a parameter that is not tensor_model_parallel on model-parallel rank 0 alone.
double tp_shard_sum_of_squares(const model::Model& model, int unit, size_t unit_offset, const ShardInfo& shard,
                               const Buffer& grads, int tp_rank);

// The whole unit in its full layout from each TP rank's fp32 slice `local` of it: every rank's slice placed and
// summed over `tp` (the replicated tensors from its rank 0's), as phase `phase`. Collective over `tp`.
std::vector<float> gather_tp_unit(const model::Model& model, int unit, const std::vector<std::vector<int64_t>>& index,
                                  const float* local, coll::Communicator& tp, std::string_view phase);

// The model's view of a TP group (workloads/model/tensor_parallel.h): its rank and size, and its collectives over
// that group — the `tp` strategy's group and each of pp's tensor-parallel stages.
class GroupTensorParallel final : public model::TensorParallel {
 public:
  explicit GroupTensorParallel(coll::Communicator& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void all_reduce(Buffer& buffer, std::string_view what) override {
    group_.all_reduce(buffer.data(), buffer.data(), buffer.count(), buffer.dtype(), coll::ReduceOp::kSum, what);
  }
  void all_reduce_rows(float* values, size_t count, bool max, std::string_view what) override {
    group_.all_reduce(values, values, count, DType::kF32, max ? coll::ReduceOp::kMax : coll::ReduceOp::kSum, what);
  }
  void reduce_scatter(const Buffer& full, Buffer& slice, std::string_view what) override {
    group_.reduce_scatter(full.data(), slice.data(), slice.count(), slice.dtype(), coll::ReduceOp::kSum, what);
  }
  void all_gather(const Buffer& slice, Buffer& full, std::string_view what) override {
    group_.all_gather(slice.data(), full.data(), slice.count(), slice.dtype(), what);
  }

 private:
  coll::Communicator& group_;
};

// Sequence parallelism's norm weights (tp, and pp's tensor-parallel stages): each TP rank's gradients of them cover
// its rows of the sequence only. Megatron sums them over the TP group once per step, after the last micro-batch, in
// one fp32 all-reduce of all of them (finalize_model_grads, _allreduce_layernorm_grads over the main_grad buffers):
// the spans (`count` elements of `dtype` at `data` each, in order) gathered into one fp32 buffer, all-reduced over
// `tp` and written back. On a shapes-only device (`holds_data` false) only the bytes move.
struct GradientSpan {
  void* data = nullptr;
  DType dtype = DType::kF32;
  size_t count = 0;
};
void all_reduce_norm_gradients(coll::Communicator& tp, bool holds_data, const std::vector<GradientSpan>& spans);

// Element `index` of a buffer of `dtype`, as an address.
inline void* element(void* base, DType dtype, size_t index) {
  return base == nullptr ? nullptr : static_cast<char*>(base) + index * dtype_size(dtype);
}
inline const void* element(const void* base, DType dtype, size_t index) {
  return base == nullptr ? nullptr : static_cast<const char*>(base) + index * dtype_size(dtype);
}
// dst[i] = src[i] converted between dtypes (round to nearest even into bf16); nothing when either is null.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);
// dst[i] += src[i] in fp32, stored at dst_dtype; nothing when either is null.
void accumulate(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);
// Zero-fills n elements; nothing when dst is null.
void zero(void* dst, DType dtype, size_t n);

}  // namespace emu::strategy
