// Helpers every strategy shares for the model's flat unit buffers: where each unit sits in the concatenation of
// all units, which elements get weight decay, initial values, and element-wise copies between dtypes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "emu/device.h"
#include "workloads/model/model.h"
#include "workloads/model/shrink.h"
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

// The elements of `layout` that receive weight decay, shifted by `base` (sorted, non-overlapping).
std::vector<optim::DecayRange> decay_ranges(const model::UnitLayout& layout, size_t base);

// Initial fp32 values of elements [begin, begin + count) of `unit` (the same on every rank, whatever the split),
// stored into `out` at `dtype`. Nothing when out is null (shapes-only device).
void init_into(const model::Model& model, int unit, uint64_t seed, size_t begin, size_t count, void* out, DType dtype);

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
