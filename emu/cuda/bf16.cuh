// bf16 ↔ fp32 in CUDA kernels: emu/bf16.h's conversion, bit for bit (round to nearest even, NaN kept a quiet
// NaN), so a bf16 tensor holds the same bits whichever backend wrote it. bf16 is a uint16_t bit pattern here too,
// not __nv_bfloat16, whose conversions may differ on NaN.
#pragma once

#include <cstdint>

namespace emu::cuda {

__device__ inline float bf16_load(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

__device__ inline uint16_t bf16_store(float value) {
  const uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace emu::cuda
