// Spans of fp32 or bf16 elements, as a device buffer stores them (bf16 as 16-bit patterns, emu/bf16.h).
//
// The optimizer reads and writes weights, moments and gradients whose dtype depends on the precision recipe;
// these views carry the dtype beside the pointer so one call covers every recipe, and the kernels dispatch on
// it once per call, not per element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "emu/check.h"
#include "emu/device.h"
#include "emu/dtype.h"

namespace emu::optim {

class ConstElementSpan;

// `count` writable elements of `dtype`. data() may be null only when count is 0 or the device holds no data.
class ElementSpan {
 public:
  ElementSpan() = default;
  ElementSpan(std::span<float> values) : data_(values.data()), count_(values.size()), dtype_(DType::kF32) {}
  // bf16 bit patterns.
  ElementSpan(std::span<uint16_t> values) : data_(values.data()), count_(values.size()), dtype_(DType::kBF16) {}
  ElementSpan(void* data, size_t count, DType dtype) : data_(data), count_(count), dtype_(dtype) {}
  // The whole buffer.
  static ElementSpan of(const Buffer& buffer) { return {buffer.data(), buffer.count(), buffer.dtype()}; }

  void* data() const { return data_; }
  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  DType dtype() const { return dtype_; }
  // Elements [offset, offset + count).
  ElementSpan subspan(size_t offset, size_t count) const {
    EMU_CHECK(offset <= count_ && count <= count_ - offset, "subspan [{}, +{}) of {} elements", offset, count, count_);
    return {data_ == nullptr ? nullptr : static_cast<char*>(data_) + offset * dtype_size(dtype_), count, dtype_};
  }

 private:
  void* data_ = nullptr;
  size_t count_ = 0;
  DType dtype_ = DType::kF32;
};

// `count` read-only elements of `dtype`.
class ConstElementSpan {
 public:
  ConstElementSpan() = default;
  ConstElementSpan(std::span<const float> values) : data_(values.data()), count_(values.size()), dtype_(DType::kF32) {}
  ConstElementSpan(std::span<const uint16_t> values)
      : data_(values.data()), count_(values.size()), dtype_(DType::kBF16) {}
  ConstElementSpan(const void* data, size_t count, DType dtype) : data_(data), count_(count), dtype_(dtype) {}
  ConstElementSpan(ElementSpan values) : data_(values.data()), count_(values.size()), dtype_(values.dtype()) {}
  static ConstElementSpan of(const Buffer& buffer) { return {buffer.data(), buffer.count(), buffer.dtype()}; }

  const void* data() const { return data_; }
  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  DType dtype() const { return dtype_; }
  ConstElementSpan subspan(size_t offset, size_t count) const {
    EMU_CHECK(offset <= count_ && count <= count_ - offset, "subspan [{}, +{}) of {} elements", offset, count, count_);
    return {data_ == nullptr ? nullptr : static_cast<const char*>(data_) + offset * dtype_size(dtype_), count, dtype_};
  }

 private:
  const void* data_ = nullptr;
  size_t count_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace emu::optim
