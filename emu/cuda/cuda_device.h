// The CUDA backend: an emulated GPU whose buffers live on a real one, under the same cap and accounting.
//
// The cap is the emulated card's (MemoryPool); the real card's free memory is a second limit, checked when the
// device is made and on every allocation, with an error that says which limit was hit. Several ranks may share
// one real GPU (8 emulated A100-40GB on one 141 GB H200), each with its own cap: gpu = local_rank % device count.
#pragma once

#include <cstdint>
#include <memory>

#include "emu/device.h"
#include "emu/ops.h"

namespace emu::cuda {

// Where a CUDA device's buffers live.
enum class Memory : uint8_t {
  // cudaMallocManaged: on the GPU, and readable by host code too. The default while the strategies' bookkeeping
  // and the collective algorithms' reductions are host code (collectives/reduce.cpp); the model's math and AdamW
  // run in the CUDA ops either way.
  kManaged,
  // cudaMalloc: GPU memory proper, for code that computes only through Ops and NCCL.
  kDevice,
};

// GPUs this process can see; 0 when there are none or no driver (never fatal, for tests that skip).
int device_count();
// The real GPU a rank uses: local_rank % device_count(); ends the job when there is none.
int gpu_for_local_rank(int local_rank);

// A device on real GPU `gpu`: allocations charged to `options` (cap, reserve, mode) as on every backend, then
// cudaMalloc'ed and zero-filled. Its ops() are the CUDA kernels and cuBLAS (cuda_ops.cu, attention.cu). Throws
// InputError when the cap is larger than the card's free memory.
std::unique_ptr<Device> make_cuda_device(MemoryPool::Options options, int gpu, Memory memory = Memory::kManaged);

// The CUDA Ops on `gpu` alone (no device): for tests and tools that bring their own buffers.
std::unique_ptr<Ops> make_cuda_ops(int gpu);

}  // namespace emu::cuda
