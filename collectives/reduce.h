// Element-wise reduction kernels for the algorithms, on fp32 and bf16.
//
// bf16 is reduced as NCCL does: each element is widened to fp32, combined, and rounded back to bf16 (nearest even)
// at every step, so a sum over N ranks is rounded N-1 times, in the order the algorithm combines the partial sums.
// Inputs whose partial sums are exact in bf16 (small integers) give the same bits on every algorithm.
#pragma once

#include <cstddef>

#include "collectives/types.h"

namespace emu::coll {

// dst[i] = a[i] op b[i] for i < count. dst may alias a or b. kAvg combines as kSum (scaled at the end).
void reduce(DType dtype, ReduceOp op, const void* a, const void* b, void* dst, size_t count);

// data[i] /= divisor: the final step of ReduceOp::kAvg, rounded once for bf16.
void divide(DType dtype, void* data, size_t count, int divisor);

}  // namespace emu::coll
