// The CUDA backend's memory: cudaMalloc (or cudaMallocManaged) under the emulated cap, zero-filled, with the real
// card's free memory as a second limit.
#include "emu/cuda/cuda_device.h"

#include <fmt/format.h>

#include "emu/check.h"
#include "emu/cuda/check.h"
#include "emu/units.h"

namespace emu::cuda {
namespace {

uint64_t free_bytes(uint64_t* total = nullptr) {
  size_t free = 0, all = 0;
  EMU_CUDA_CHECK(cudaMemGetInfo(&free, &all));
  if (total != nullptr) *total = all;
  return free;
}

class CudaDevice final : public Device {
 public:
  CudaDevice(MemoryPool::Options options, int gpu, Memory memory) : Device(options), gpu_(gpu), memory_kind_(memory) {
    EMU_CUDA_CHECK(cudaSetDevice(gpu_));
    EMU_CUDA_CHECK(cudaFree(nullptr));  // creates the context now, so its memory shows in cudaMemGetInfo
    uint64_t total = 0;
    const uint64_t free = free_bytes(&total);
    // The reserve stands for the CUDA context and NCCL's buffers, which really exist here: only the rest of the
    // cap must fit in what the card has left.
    const uint64_t cap = options.cap;
    if (cap != kNoCap && cap > options.reserve && cap - options.reserve > free) {
      throw InputError(fmt::format(
          "rank {}: the emulated cap of {} bytes (reserve {} included) does not fit on real GPU {}: {} of {} bytes "
          "free. Lower the cap, run fewer ranks per GPU, or use the cpu backend",
          options.rank, cap, options.reserve, gpu_, free, total));
    }
    ops_ = make_cuda_ops(gpu_);
  }

  std::string_view backend() const override { return "cuda"; }
  bool holds_data() const override { return true; }
  Ops* ops() override { return ops_.get(); }

 protected:
  void* raw_allocate(size_t bytes) override {
    EMU_CUDA_CHECK(cudaSetDevice(gpu_));
    void* data = nullptr;
    const cudaError_t rc = memory_kind_ == Memory::kManaged ? cudaMallocManaged(&data, bytes, cudaMemAttachGlobal)
                                                            : cudaMalloc(&data, bytes);
    if (rc == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clears the sticky allocation error
      uint64_t total = 0;
      const uint64_t free = free_bytes(&total);
      fatal(fmt::format("the real GPU {} ran out of memory below the emulated cap: {} bytes requested, {} of {} "
                        "free on the card, {} in use of this rank's cap {}. Ranks sharing the card take from the same "
                        "memory: run fewer ranks per GPU or lower the cap",
                        gpu_, bytes, free, total, memory().in_use(), memory().cap()),
            __FILE__, __LINE__);
    }
    EMU_CUDA_CHECK(rc);
    // Zero-filled, as every backend's buffers; the host may read a managed buffer next, so wait for the fill.
    EMU_CUDA_CHECK(cudaMemset(data, 0, bytes));
    if (memory_kind_ == Memory::kManaged) EMU_CUDA_CHECK(cudaDeviceSynchronize());
    return data;
  }

  void raw_free(void* data, size_t) override {
    const cudaError_t rc = cudaFree(data);
    // At process exit the runtime may already be gone; the memory goes with it.
    if (rc != cudaErrorCudartUnloading) EMU_CUDA_CHECK(rc);
  }

 private:
  int gpu_;
  Memory memory_kind_;
  std::unique_ptr<Ops> ops_;
};

}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

int gpu_for_local_rank(int local_rank) {
  int count = 0;
  EMU_CUDA_CHECK(cudaGetDeviceCount(&count));
  EMU_CHECK(count > 0, "no GPU visible (local rank {})", local_rank);
  return local_rank % count;
}

std::unique_ptr<Device> make_cuda_device(MemoryPool::Options options, int gpu, Memory memory) {
  return std::make_unique<CudaDevice>(options, gpu, memory);
}

}  // namespace emu::cuda
