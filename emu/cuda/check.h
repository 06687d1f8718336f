// Checks for the CUDA runtime and cuBLAS: a failed call names itself, CUDA's error text, file:line and a hint,
// then ends every rank (emu::fatal, exit code 3), as EMU_CHECK and EMU_MPI_CHECK do.
//
// This header stays free of fmt (emu/check.h), since nvcc cannot compile fmt's compile-time format checks: .cu
// files use these macros and EMU_CUDA_REQUIRE; the formatting happens in check.cpp.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

namespace emu::cuda::detail {
[[noreturn]] void cuda_failed(const char* call, cudaError_t rc, const char* file, int line);
[[noreturn]] void cublas_failed(const char* call, cublasStatus_t rc, const char* file, int line);
[[noreturn]] void check_failed(const char* condition, const std::string& what, const char* file, int line);
}  // namespace emu::cuda::detail

// EMU_CUDA_CHECK(cudaMalloc(...)): on an error, names the call, CUDA's error and a hint, ends every rank.
#define EMU_CUDA_CHECK(call)                                                     \
  do {                                                                           \
    const cudaError_t emu_cuda_rc_ = (call);                                     \
    if (emu_cuda_rc_ != cudaSuccess) [[unlikely]] {                              \
      ::emu::cuda::detail::cuda_failed(#call, emu_cuda_rc_, __FILE__, __LINE__); \
    }                                                                            \
  } while (0)

// EMU_CUBLAS_CHECK(cublasGemmEx(...)): the same for cuBLAS status codes.
#define EMU_CUBLAS_CHECK(call)                                                       \
  do {                                                                               \
    const cublasStatus_t emu_cublas_rc_ = (call);                                    \
    if (emu_cublas_rc_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                      \
      ::emu::cuda::detail::cublas_failed(#call, emu_cublas_rc_, __FILE__, __LINE__); \
    }                                                                                \
  } while (0)

// After a kernel launch: launch errors (bad configuration) show at once, not at the next call.
#define EMU_CUDA_CHECK_LAUNCH() EMU_CUDA_CHECK(cudaGetLastError())

// EMU_CUDA_REQUIRE(cond, std::string): EMU_CHECK for .cu files.
#define EMU_CUDA_REQUIRE(cond, what)                                        \
  do {                                                                      \
    if (!(cond)) [[unlikely]]                                               \
      ::emu::cuda::detail::check_failed(#cond, (what), __FILE__, __LINE__); \
  } while (0)
