// fp32 working copies of device tensors for the model's ops.
//
// A device tensor lives at its logical dtype (bf16 really stored in 2 bytes). The ops compute in fp32, so around
// each op a bf16 tensor is widened into an fp32 copy in the backend's scratch (Ops::scratch_allocate) and, if
// written, rounded back to nearest even. That copy is working memory a GPU kernel reading bf16 directly would not
// need, so it is not charged to the device, on any backend. An fp32 tensor is used in place, without a copy. On
// a shapes-only device there is no data: get() is null.
#pragma once

#include <cstddef>
#include <cstdint>

#include "emu/device.h"
#include "emu/dtype.h"
#include "emu/ops.h"

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

  // `ops` may be null only when the buffer holds no data.
  F32(Ops* ops, const Buffer& buffer, Access access);
  ~F32();
  F32(const F32&) = delete;
  F32& operator=(const F32&) = delete;

  float* get() const { return data_; }
  operator float*() const { return data_; }

 private:
  Ops* ops_;
  const Buffer& buffer_;
  bool write_back_ = false;
  Scratch copy_;  // [count] the fp32 copy of a bf16 buffer; unused for fp32 buffers
  float* data_ = nullptr;
};

}  // namespace emu::model
