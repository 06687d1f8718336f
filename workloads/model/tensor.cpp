#include "workloads/model/tensor.h"

#include <cstring>

#include "emu/bf16.h"
#include "emu/check.h"

namespace emu::model {

void widen(const void* src, DType dtype, size_t n, float* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  widen_bf16(static_cast<const uint16_t*>(src), dst, n);
}

void narrow(const float* src, DType dtype, size_t n, void* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  narrow_bf16(src, static_cast<uint16_t*>(dst), n);
}

void accumulate_into(void* dst, DType dtype, const float* src, size_t n) {
  if (dtype == DType::kF32) {
    float* out = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) out[i] += src[i];
    return;
  }
  accumulate_bf16(static_cast<uint16_t*>(dst), src, n);
}

F32::F32(Ops* ops, const Buffer& buffer, Access access) : ops_(ops), buffer_(buffer) {
  if (buffer.data() == nullptr) return;
  if (buffer.dtype() == DType::kF32) {
    data_ = buffer.as<float>();
    return;
  }
  EMU_CHECK(ops_ != nullptr, "a bf16 working copy needs the device's ops");
  data_ = copy_.reserve_as<float>(*ops_, buffer.count(), access == Access::kWrite);
  if (access != Access::kWrite) ops_->bf16_to_f32(buffer.as<uint16_t>(), data_, buffer.count());
  write_back_ = access != Access::kRead;
}

F32::~F32() {
  if (write_back_) ops_->f32_to_bf16(data_, buffer_.as<uint16_t>(), buffer_.count());
}

}  // namespace emu::model
