#include "workloads/model/tensor.h"

#include <cstring>

namespace emu::model {

void widen(const void* src, DType dtype, size_t n, float* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  const uint16_t* in = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(in[i]);
}

void narrow(const float* src, DType dtype, size_t n, void* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(src[i]);
}

void accumulate_into(void* dst, DType dtype, const float* src, size_t n) {
  if (dtype == DType::kF32) {
    float* out = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) out[i] += src[i];
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(bf16_to_float(out[i]) + src[i]);
}

F32::F32(const Buffer& buffer, Access access) : buffer_(buffer) {
  if (buffer.data() == nullptr) return;
  if (buffer.dtype() == DType::kF32) {
    data_ = buffer.as<float>();
    return;
  }
  host_.resize(buffer.count());
  if (access != Access::kWrite) widen(buffer.data(), buffer.dtype(), buffer.count(), host_.data());
  write_back_ = access != Access::kRead;
  data_ = host_.data();
}

F32::~F32() {
  if (write_back_) narrow(host_.data(), buffer_.dtype(), host_.size(), buffer_.data());
}

}  // namespace emu::model
