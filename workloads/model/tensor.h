// fp32 working copies of device tensors for the CPU math.
//
// A device tensor lives at its logical dtype (bf16 really stored in 2 bytes). The CPU kernels compute in fp32, so
// around each kernel a bf16 tensor is widened into a host fp32 copy and, if written, rounded back to nearest even.
// That host copy is scratch a GPU would not need (its kernels read bf16 directly), so it is not charged to the
// device. An fp32 tensor is used in place, without a copy. On a shapes-only device there is no data: get() is null.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "emu/device.h"
#include "emu/dtype.h"

namespace emu::model {

// dst[i] = src[i] widened to fp32.
void widen(const void* src, DType dtype, size_t n, float* dst);
// dst[i] = src[i] stored at dtype (rounded to nearest even for bf16).
void narrow(const float* src, DType dtype, size_t n, void* dst);
// dst[i] = dst[i] + src[i], computed in fp32 and stored at dtype: how a gradient is accumulated into a buffer.
void accumulate_into(void* dst, DType dtype, const float* src, size_t n);

class F32 {
 public:
  enum class Access : uint8_t { kRead, kWrite, kReadWrite };

  F32(const Buffer& buffer, Access access);
  ~F32();
  F32(const F32&) = delete;
  F32& operator=(const F32&) = delete;

  float* get() const { return data_; }
  operator float*() const { return data_; }

 private:
  const Buffer& buffer_;
  bool write_back_ = false;
  std::vector<float> host_;  // [count] the fp32 copy of a bf16 buffer; empty for fp32 buffers
  float* data_ = nullptr;
};

}  // namespace emu::model
