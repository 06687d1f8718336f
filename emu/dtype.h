// Logical element types. Memory is counted at the logical size (bf16 = 2 bytes), and bf16 values really are
// stored in 2 bytes, rounded to nearest even, exactly as a GPU stores them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace emu {

enum class DType : uint8_t { kF32, kBF16 };

constexpr size_t dtype_size(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }
constexpr std::string_view dtype_name(DType dtype) { return dtype == DType::kF32 ? "float32" : "bfloat16"; }

// bf16 bit pattern of `value`, rounded to nearest even; NaN stays a (quiet) NaN.
inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float bf16_to_float(uint16_t value) { return std::bit_cast<float>(static_cast<uint32_t>(value) << 16); }

// Rounds `value` to the nearest bf16 and back: what a value looks like after a bf16 store.
inline float round_to_bf16(float value) { return bf16_to_float(float_to_bf16(value)); }

}  // namespace emu
