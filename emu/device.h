// The emulated GPU: its capped memory, the buffers allocated from it, and the ops that compute on them.
//
// One Device per rank. A backend (cpu/, shapes/, cuda/: one folder each, holding its device and its ops) decides
// where bytes live and what computes on them; the accounting, the cap and the categories are the same for all of
// them. Model and strategy code allocate through allocate(), compute through ops(), and never know which backend
// they run on.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "emu/dtype.h"
#include "emu/memory.h"

namespace emu {

class Device;
class Ops;  // emu/ops.h

// A device allocation of `count` elements of `dtype`, charged to the device's memory until it is destroyed or
// reset. Move-only. data() is null when the device holds no data (shapes-only accounting) or count is 0.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer() { reset(); }
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      reset();
      swap(other);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void reset();
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  size_t bytes() const { return count_ * dtype_size(dtype_); }
  // What the device's memory is charged for it: bytes(), unless it was allocated with a charge of its own.
  size_t charged_bytes() const { return charge_.bytes; }
  Category category() const { return charge_.category; }
  Device* device() const { return device_; }
  bool allocated() const { return device_ != nullptr; }

 private:
  friend class Device;
  class Ops;  // emu/ops.h
  void swap(Buffer& other) noexcept;

  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t count_ = 0;
  DType dtype_ = DType::kF32;
  MemoryPool::Charge charge_;  // what the device's memory gives back on reset
};

class Device {
 public:
  explicit Device(MemoryPool::Options options) : memory_(options) {}
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual std::string_view backend() const = 0;
  // False for shapes-only accounting: buffers are charged but hold nothing and no math is done.
  virtual bool holds_data() const = 0;
  // The ops that compute on this device's buffers (emu/ops.h): the backend's own kernels (cpu/cpu_ops.h,
  // cuda/cuda_ops.cu). Null for a device that holds no data (shapes), which computes nothing.
  virtual Ops* ops() = 0;

  MemoryPool& memory() { return memory_; }
  const MemoryPool& memory() const { return memory_; }

  // Charges count * dtype_size(dtype) bytes to `category` (may throw OutOfMemoryError in strict mode), then
  // allocates them, zero-filled. `what` names the tensor in out-of-memory reports.
  Buffer allocate(size_t count, DType dtype, Category category, std::string_view what = {});
  // As above, but charges `charged_bytes` instead of count * dtype_size(dtype): a shrunk run's term that scales by
  // k rather than k² (a norm weight, a per-row statistic) is charged at its full-scale bytes / k² (DESIGN.md §1).
  Buffer allocate(size_t count, DType dtype, Category category, std::string_view what, size_t charged_bytes);

 protected:
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_free(void* data, size_t bytes) = 0;

 private:
  friend class Buffer;
  MemoryPool memory_;
};

// Host memory: the CPU backend, where the math runs with Eigen and OpenBLAS (emu/cpu/).
std::unique_ptr<Device> make_cpu_device(MemoryPool::Options options);
// Accounting only: every allocation is charged, none holds data. Accounts full-scale models in seconds.
std::unique_ptr<Device> make_shapes_device(MemoryPool::Options options);

}  // namespace emu
