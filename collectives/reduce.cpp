#include "collectives/reduce.h"

#include <algorithm>
#include <cstdint>

#include "emu/bf16.h"

namespace emu::coll {
namespace {

// Separate loops per (type, op) so the compiler vectorises each; __restrict__ is not claimed because dst may
// alias an input.
template <typename Combine>
void reduce_f32(const float* a, const float* b, float* dst, size_t count, Combine combine) {
  for (size_t i = 0; i < count; ++i) dst[i] = combine(a[i], b[i]);
}

template <typename Combine>
void reduce_bf16(const uint16_t* a, const uint16_t* b, uint16_t* dst, size_t count, Combine combine) {
  for (size_t i = 0; i < count; ++i) dst[i] = float_to_bf16(combine(bf16_to_float(a[i]), bf16_to_float(b[i])));
}

struct Sum {
  float operator()(float x, float y) const { return x + y; }
};
struct Max {
  float operator()(float x, float y) const { return std::max(x, y); }
};

}  // namespace

void reduce(DType dtype, ReduceOp op, const void* a, const void* b, void* dst, size_t count) {
  const bool max = op == ReduceOp::kMax;
  if (dtype == DType::kF32) {
    const auto* x = static_cast<const float*>(a);
    const auto* y = static_cast<const float*>(b);
    auto* out = static_cast<float*>(dst);
    max ? reduce_f32(x, y, out, count, Max{}) : reduce_f32(x, y, out, count, Sum{});
  } else {
    const auto* x = static_cast<const uint16_t*>(a);
    const auto* y = static_cast<const uint16_t*>(b);
    auto* out = static_cast<uint16_t*>(dst);
    max ? reduce_bf16(x, y, out, count, Max{}) : reduce_bf16(x, y, out, count, Sum{});
  }
}

void divide(DType dtype, void* data, size_t count, int divisor) {
  const float d = static_cast<float>(divisor);
  if (dtype == DType::kF32) {
    auto* x = static_cast<float*>(data);
    for (size_t i = 0; i < count; ++i) x[i] /= d;
  } else {
    auto* x = static_cast<uint16_t*>(data);
    for (size_t i = 0; i < count; ++i) x[i] = float_to_bf16(bf16_to_float(x[i]) / d);
  }
}

}  // namespace emu::coll
