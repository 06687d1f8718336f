#include "emu/cuda/check.h"

#include <fmt/format.h>

#include "emu/check.h"

namespace emu::cuda::detail {
namespace {

std::string_view hint(cudaError_t rc) {
  switch (rc) {
    case cudaErrorNoDevice:
      return "no GPU is visible to this process: check nvidia-smi and CUDA_VISIBLE_DEVICES, or run the CPU backend";
    case cudaErrorInsufficientDriver:
      return "the NVIDIA driver is older than the CUDA runtime emu was built with; update the driver";
    case cudaErrorInvalidDevice:
      return "the GPU index is not one of this node's GPUs; ranks choose local_rank % device count";
    case cudaErrorMemoryAllocation:
      return "the real GPU is full below the emulated cap: fewer ranks per GPU, a smaller --cap, or a bigger card";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return "the GPU's architecture is not in CMAKE_CUDA_ARCHITECTURES; reconfigure with its compute capability";
    case cudaErrorDevicesUnavailable:
      return "the GPU is in exclusive-process mode and taken; share it only in default compute mode";
    default: return "see the CUDA runtime documentation for this error";
  }
}

}  // namespace

void cuda_failed(const char* call, cudaError_t rc, const char* file, int line) {
  fatal(fmt::format("CUDA call failed: {}: {} ({}); hint: {}", call, cudaGetErrorString(rc), cudaGetErrorName(rc),
                    hint(rc)),
        file, line);
}

void cublas_failed(const char* call, cublasStatus_t rc, const char* file, int line) {
  const std::string_view advice = rc == CUBLAS_STATUS_NOT_INITIALIZED ? "cuBLAS could not start: is a GPU visible?"
                                  : rc == CUBLAS_STATUS_ALLOC_FAILED  ? "the real GPU is full (cuBLAS workspace)"
                                  : rc == CUBLAS_STATUS_INVALID_VALUE ? "a size or leading dimension is invalid"
                                                                      : "see the cuBLAS documentation for this status";
  fatal(fmt::format("cuBLAS call failed: {}: {} (status {}); hint: {}", call, cublasGetStatusString(rc),
                    static_cast<int>(rc), advice),
        file, line);
}

void check_failed(const char* condition, const std::string& what, const char* file, int line) {
  fatal(fmt::format("check failed: {}: {}", condition, what), file, line);
}

}  // namespace emu::cuda::detail
