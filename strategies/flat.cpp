#include "strategies/flat.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "emu/check.h"
#include "workloads/model/layout.h"
#include "workloads/model/tensor.h"
#include "workloads/model/tensor_parallel.h"

namespace emu::strategy {

FlatLayout flat_layout(const model::Model& model) {
  FlatLayout flat;
  for (int u = 0; u < model.num_units(); ++u) {
    flat.offset.push_back(flat.total);
    flat.count.push_back(model.layout(u).count);
    flat.total += model.layout(u).count;
    flat.unit_charge.push_back(unit_charge(model, u));
  }
  flat.charge = model::parameter_charge(model.config(), model.layouts());
  return flat;
}

bool tp_replicated(const model::Model& model, int unit, size_t param) {
  return model.layout(unit).params[param].count == model.full_layout(unit).params[param].count;
}

model::ParameterCharge unit_charge(const model::Model& model, int unit) {
  return model::parameter_charge(model.config(), {&model.layout(unit), 1});
}

uint64_t largest_tensor_charge(const model::Model& model, int unit) {
  const std::vector<model::ParamInfo>& params = model.layout(unit).params;
  uint64_t largest = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (unit == 0 && model::gradient_made_at_end(model.config(), i)) continue;
    largest = std::max<uint64_t>(largest, model::tensor_charge(model.config(), params[i]));
  }
  return largest;
}

uint64_t root_embedding_charge(const model::Model& model) {
  const std::vector<model::ParamInfo>& params = model.layout(0).params;
  uint64_t charged = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (model::gradient_made_at_end(model.config(), i)) charged += model::tensor_charge(model.config(), params[i]);
  }
  return charged;
}

size_t param_holding(const model::Model& model, int unit, size_t offset) {
  const std::vector<model::ParamInfo>& params = model.layout(unit).params;
  for (size_t i = 0; i < params.size(); ++i) {
    if (offset >= params[i].offset && offset < params[i].offset + params[i].count) return i;
  }
  EMU_CHECK(false, "no parameter of unit {} holds element {}", unit, offset);
  return params.size();
}

namespace {
// Parameter `param` of `unit`'s .grad at `dtype`, charged as a shrunk run charges that tensor, holding nothing.
Buffer charge_tensor_gradient(Device& device, const model::Model& model, int unit, size_t param, DType dtype,
                              std::string_view what) {
  const model::ParamInfo& info = model.layout(unit).params[param];
  return device.allocate(0, dtype, Category::kGradients, fmt::format("{}, {}", what, info.name),
                         model::tensor_charge(model.config(), info) * dtype_size(dtype));
}
}  // namespace

Buffer allocate_root_gradients(Device& device, const model::Model& model, size_t count, DType dtype,
                               std::string_view what) {
  const size_t whole = unit_charge(model, 0).bytes(count, dtype);
  size_t tensors = 0;
  for (const model::ParamInfo& param : model.layout(0).params) {
    tensors += model::tensor_charge(model.config(), param) * dtype_size(dtype);
  }
  return device.allocate(count, dtype, Category::kGradients, what, whole > tensors ? whole - tensors : 0);
}

void RootGradientCharges::begin(Device& device, const model::Model& model, DType dtype, std::string_view what) {
  if (begun()) return;
  device_ = &device;
  model_ = &model;
  dtype_ = dtype;
  what_ = what;
  tensors_.clear();
  tensors_.resize(model.layout(0).params.size());
}

void RootGradientCharges::made(size_t offset) {
  EMU_CHECK(begun(), "a root gradient made before the root's backward began");
  const size_t i = param_holding(*model_, 0, offset);
  if (model::gradient_made_at_end(model_->config(), i) || tensors_[i].allocated()) return;
  tensors_[i] = charge_tensor_gradient(*device_, *model_, 0, i, dtype_, what_);
}

void RootGradientCharges::embeddings_made() {
  EMU_CHECK(begun(), "the embeddings' gradients made before the root's backward began");
  if (embeddings_.allocated()) return;
  embeddings_ = device_->allocate(0, dtype_, Category::kGradients, fmt::format("{}, embeddings", what_),
                                  root_embedding_charge(*model_) * dtype_size(dtype_));
}

void RootGradientCharges::reset() {
  tensors_.clear();
  embeddings_.reset();
  device_ = nullptr;
}

void BlockGradients::allocate(Device& device, const model::Model& model, int unit, DType dtype, std::string_view what) {
  device_ = &device;
  model_ = &model;
  unit_ = unit;
  dtype_ = dtype;
  what_ = what;
  buffer_ = device.allocate(model.layout(unit).count, dtype, Category::kGradients, what, 0);
  tensors_.clear();
  tensors_.resize(model.layout(unit).params.size());
}

void BlockGradients::made(size_t offset) {
  EMU_CHECK(buffer_.allocated(), "a gradient of unit {} made before its buffer", unit_);
  const size_t i = param_holding(*model_, unit_, offset);
  if (!tensors_[i].allocated()) tensors_[i] = charge_tensor_gradient(*device_, *model_, unit_, i, dtype_, what_);
}

void BlockGradients::check_complete() const {
  const std::vector<model::ParamInfo>& params = model_->layout(unit_).params;
  for (size_t i = 0; i < params.size(); ++i) {
    EMU_CHECK(tensors_[i].allocated(), "unit {}'s backward ended without making {}'s gradient", unit_, params[i].name);
  }
}

void BlockGradients::reset() {
  tensors_.clear();
  buffer_.reset();
}

std::vector<optim::DecayRange> decay_ranges(const model::UnitLayout& layout, size_t base) {
  std::vector<optim::DecayRange> ranges;
  for (const model::ParamInfo& param : layout.params) {
    if (!param.decay) continue;
    const size_t begin = base + param.offset;
    if (!ranges.empty() && ranges.back().end == begin) {
      ranges.back().end = begin + param.count;
    } else {
      ranges.push_back({begin, begin + param.count});
    }
  }
  return ranges;
}

std::vector<std::vector<int64_t>> tp_slice_index(const model::Model& model, int unit, int rank, int size) {
  const model::UnitLayout& local = model.layout(unit);
  const model::UnitLayout& full = model.full_layout(unit);
  std::vector<std::vector<int64_t>> index;
  for (size_t p = 0; p < local.params.size(); ++p) {
    index.push_back(model::tensor_parallel_index(model.full_config(), full.params[p], local.params[p], rank, size));
  }
  return index;
}

void init_tp_slice(const model::Model& model, int unit, uint64_t seed, const std::vector<std::vector<int64_t>>& index,
                   float* out) {
  const model::UnitLayout& local = model.layout(unit);
  const model::UnitLayout& full = model.full_layout(unit);
  std::vector<float> values(full.count);
  model.init_unit(unit, seed, values.data());
  std::fill_n(out, local.count, 0.0f);
  for (size_t p = 0; p < local.params.size(); ++p) {
    for (size_t i = 0; i < index[p].size(); ++i) {
      if (index[p][i] >= 0) out[local.params[p].offset + i] = values[full.params[p].offset + size_t(index[p][i])];
    }
  }
}

void place_tp_slice(const model::Model& model, int unit, const std::vector<std::vector<int64_t>>& index,
                    const float* local, bool replicated_too, float* full) {
  const model::UnitLayout& mine = model.layout(unit);
  const model::UnitLayout& whole = model.full_layout(unit);
  for (size_t p = 0; p < mine.params.size(); ++p) {
    if (tp_replicated(model, unit, p) && !replicated_too) continue;
    for (size_t i = 0; i < index[p].size(); ++i) {
      if (index[p][i] >= 0) full[whole.params[p].offset + size_t(index[p][i])] += local[mine.params[p].offset + i];
    }
  }
}

double tp_shard_sum_of_squares(const model::Model& model, int unit, size_t unit_offset, const ShardInfo& shard,
                               const Buffer& grads, int tp_rank) {
  const std::vector<model::ParamInfo>& params = model.layout(unit).params;
  double sum = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    if (tp_rank != 0 && tp_replicated(model, unit, p)) continue;
    const size_t begin = unit_offset + params[p].offset;
    size_t lo = 0, hi = 0;
    shard.intersect(begin, begin + params[p].count, lo, hi);
    if (hi == lo) continue;
    sum += optim::grad_sum_of_squares(
        optim::ConstElementSpan(element(grads.data(), grads.dtype(), lo - shard.offset), hi - lo, grads.dtype()));
  }
  return sum;
}

std::vector<float> gather_tp_unit(const model::Model& model, int unit, const std::vector<std::vector<int64_t>>& index,
                                  const float* local, coll::Communicator& tp, std::string_view phase) {
  std::vector<float> full(model.full_layout(unit).count, 0.0f);
  place_tp_slice(model, unit, index, local, tp.rank() == 0, full.data());
  tp.all_reduce(full.data(), full.data(), full.size(), DType::kF32, coll::ReduceOp::kSum, phase);
  return full;
}

void init_into(const model::Model& model, int unit, uint64_t seed, size_t begin, size_t count, void* out, DType dtype) {
  if (out == nullptr || count == 0) return;
  std::vector<float> values(count);  // host scratch: initial values are made on the host and copied in
  model.initial_values(unit, seed, begin, count, values.data());
  model::narrow(values.data(), dtype, count, out);
}

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  if (src == nullptr || dst == nullptr || n == 0) return;
  if (src_dtype == dst_dtype) {
    std::memmove(dst, src, n * dtype_size(src_dtype));
    return;
  }
  std::vector<float> widened(n);  // host scratch for the CPU conversion
  model::widen(src, src_dtype, n, widened.data());
  model::narrow(widened.data(), dst_dtype, n, dst);
}

void accumulate(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  if (src == nullptr || dst == nullptr || n == 0) return;
  std::vector<float> widened(n);  // host scratch for the CPU arithmetic
  model::widen(src, src_dtype, n, widened.data());
  model::accumulate_into(dst, dst_dtype, widened.data(), n);
}

void zero(void* dst, DType dtype, size_t n) {
  if (dst != nullptr) std::memset(dst, 0, n * dtype_size(dtype));
}

void all_reduce_norm_gradients(coll::Communicator& tp, bool holds_data, const std::vector<GradientSpan>& spans) {
  size_t total = 0;
  for (const GradientSpan& span : spans) total += span.count;
  std::vector<float> sums(holds_data ? total : 0);
  size_t at = 0;
  for (const GradientSpan& span : spans) {
    if (holds_data) convert(span.data, span.dtype, sums.data() + at, DType::kF32, span.count);
    at += span.count;
  }
  float* data = holds_data ? sums.data() : nullptr;
  tp.all_reduce(data, data, total, DType::kF32, coll::ReduceOp::kSum,
                "tp all-reduce, sequence-parallel norm gradients");
  if (!holds_data) return;
  at = 0;
  for (const GradientSpan& span : spans) {
    convert(sums.data() + at, DType::kF32, span.data, span.dtype, span.count);
    at += span.count;
  }
}

}  // namespace emu::strategy
