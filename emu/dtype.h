// Logical element types. Memory is counted at the logical size (bf16 = 2 bytes), and bf16 values really are
// stored in 2 bytes, rounded to nearest even, exactly as a GPU stores them (the conversions: emu/bf16.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace emu {

enum class DType : uint8_t { kF32, kBF16 };

constexpr size_t dtype_size(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }
constexpr std::string_view dtype_name(DType dtype) { return dtype == DType::kF32 ? "float32" : "bfloat16"; }

}  // namespace emu
