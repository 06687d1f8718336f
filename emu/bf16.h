// bf16 ↔ fp32 on the host: the one conversion every host path uses (the CUDA kernels' twin, bit for bit, is
// emu/cuda/bf16.cuh).
//
// A bf16 value is stored as the top 16 bits of an fp32 bit pattern (uint16_t). Widening is exact. Narrowing rounds
// to nearest even, as a GPU stores bf16 (__float2bfloat16_rn, PyTorch's .to(torch.bfloat16)): a value past the
// largest bf16 rounds to infinity, infinities stay infinite, and a NaN stays a NaN, made quiet, instead of being
// rounded (which could carry its payload into the exponent and turn it into infinity).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace emu {

// bf16 bit pattern of `value`, rounded to nearest even; NaN stays a (quiet) NaN.
inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;  // exponent all ones and a mantissa: NaN
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  // A select rather than a branch, so that the loops below compile to vector code.
  return static_cast<uint16_t>(nan ? (bits >> 16) | 0x0040u : rounded);
}

inline float bf16_to_float(uint16_t value) { return std::bit_cast<float>(static_cast<uint32_t>(value) << 16); }

// Rounds `value` to the nearest bf16 and back: what a value looks like after a bf16 store.
inline float round_to_bf16(float value) { return bf16_to_float(float_to_bf16(value)); }

// The same over n elements: y[i] = x[i] widened; y[i] = x[i] rounded; y[i] = bf16(float(y[i]) + x[i]), a sum
// rounded once per element (a gradient accumulated into a bf16 buffer).
inline void widen_bf16(const uint16_t* __restrict x, float* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
}
inline void narrow_bf16(const float* __restrict x, uint16_t* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}
inline void accumulate_bf16(uint16_t* __restrict y, const float* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = float_to_bf16(bf16_to_float(y[i]) + x[i]);
}

}  // namespace emu
