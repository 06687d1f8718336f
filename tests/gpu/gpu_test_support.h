// Helpers of the GPU parity tests: device arrays filled from host vectors, and the skip when no GPU is seen.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "emu/cuda/check.h"
#include "emu/cuda/cuda_device.h"

namespace emu::test {

inline constexpr const char* kNoGpu =
    "no CUDA GPU visible (cudaGetDeviceCount reports none): GPU parity tests need one; run scripts/gpu-check.sh on a "
    "GPU machine";

// Skips the current test unless a GPU is visible.
#define EMU_REQUIRE_GPU()                                                      \
  do {                                                                         \
    if (::emu::cuda::device_count() == 0) GTEST_SKIP() << ::emu::test::kNoGpu; \
  } while (0)

// cudaMalloc'ed copy of a host vector; back() copies it home.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    EMU_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), bytes() == 0 ? 1 : bytes()));
    if (n_ > 0) EMU_CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  explicit DeviceArray(size_t n) : DeviceArray(std::vector<T>(n)) {}
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  operator T*() const { return data_; }
  std::vector<T> back() const {
    std::vector<T> host(n_);
    EMU_CUDA_CHECK(cudaDeviceSynchronize());
    if (n_ > 0) EMU_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  size_t bytes() const { return n_ * sizeof(T); }
  T* data_ = nullptr;
  size_t n_ = 0;
};

}  // namespace emu::test
