// What the CUDA ops' kernels share (cuda_ops.cu, attention.cu): the block size, grid-stride loops, block-wide sums
// and maxima, and launching a one-thread-per-element kernel on the legacy default stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "emu/cuda/check.h"

namespace emu::cuda {

constexpr int kThreads = 256;

inline unsigned blocks_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535u * 16u ? (blocks == 0 ? 1 : blocks) : 65535u * 16u);
}

// Grid-stride loop over [0, n).
#define EMU_FOR_EACH(i, n) \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

// Sum over the block (blockDim.x == kThreads); every thread gets the total.
template <typename T>
__device__ T block_sum(T value) {
  __shared__ T partial[kThreads];
  partial[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const T total = partial[0];
  __syncthreads();
  return total;
}

__device__ inline float block_max(float value) {
  __shared__ float partial[kThreads];
  partial[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + stride]);
    __syncthreads();
  }
  const float total = partial[0];
  __syncthreads();
  return total;
}

// kernel<<<enough blocks for n threads, kThreads>>>(args...), checked; nothing when n is 0.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), size_t n, Args... args) {
  if (n == 0) return;
  kernel<<<blocks_for(n), kThreads>>>(args...);
  EMU_CUDA_CHECK_LAUNCH();
}

}  // namespace emu::cuda
