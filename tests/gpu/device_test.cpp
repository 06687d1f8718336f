// The CUDA device: the same cap and accounting as every backend, zero-filled buffers on the GPU, the card's own
// limit, and the backend factory.
#include <gtest/gtest.h>

#include <vector>

#include "emu/backend.h"
#include "emu/check.h"
#include "emu/ops.h"
#include "emu/units.h"
#include "tests/gpu/gpu_test_support.h"

namespace emu {
namespace {

TEST(CudaBackendFactory, KnowsTheBackendsOfThisBuild) {
  EXPECT_EQ(device_backends(), "cpu, shapes, cuda");
  EXPECT_EQ(make_device("cpu", {})->backend(), "cpu");
  EXPECT_EQ(make_device("cpu", {})->ops()->backend(), "cpu");
  EXPECT_EQ(make_device("shapes", {})->ops(), nullptr);
  EXPECT_THROW(make_device("tpu", {}), InputError);
}

TEST(CudaDevice, ChargesTheCapAndZeroFills) {
  EMU_REQUIRE_GPU();
  for (cuda::Memory memory : {cuda::Memory::kManaged, cuda::Memory::kDevice}) {
    MemoryPool::Options options;
    options.cap = 64 * kMiB;
    options.reserve = 4 * kMiB;
    auto device = cuda::make_cuda_device(options, 0, memory);
    EXPECT_EQ(device->backend(), "cuda");
    ASSERT_NE(device->ops(), nullptr);
    EXPECT_EQ(device->ops()->backend(), "cuda");
    EXPECT_EQ(device->memory().in_use(), 4 * kMiB);
    {
      Buffer buffer = device->allocate(1 << 20, DType::kF32, Category::kParameters, "weights");
      EXPECT_EQ(device->memory().in_use(Category::kParameters), 4 * kMiB);
      std::vector<float> host(1 << 20, 1.0f);
      EMU_CUDA_CHECK(cudaMemcpy(host.data(), buffer.data(), host.size() * 4, cudaMemcpyDefault));
      for (float v : host) ASSERT_EQ(v, 0.0f);
      // Past the emulated cap: strict mode throws before the card is asked, as on every backend.
      EXPECT_THROW(device->allocate(60 * kMiB, DType::kBF16, Category::kActivations, "too big"), OutOfMemoryError);
    }
    EXPECT_EQ(device->memory().in_use(), 4 * kMiB);
  }
}

TEST(CudaDevice, CapLargerThanTheCardIsAnInputError) {
  EMU_REQUIRE_GPU();
  MemoryPool::Options options;
  options.cap = 1ull << 50;  // 1 PiB
  EXPECT_THROW(cuda::make_cuda_device(options, 0), InputError);
}

TEST(CudaDevice, SeveralEmulatedGpusShareOneCard) {
  EMU_REQUIRE_GPU();
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<Buffer> buffers;
  for (int rank = 0; rank < 4; ++rank) {
    MemoryPool::Options options;
    options.cap = 32 * kMiB;
    options.rank = rank;
    devices.push_back(make_device("cuda", options, /*local_rank=*/rank * cuda::device_count()));  // all on GPU 0
    buffers.push_back(devices.back()->allocate(8 * kMiB, DType::kBF16, Category::kParameters));
    EXPECT_EQ(devices.back()->memory().in_use(), 16 * kMiB);
  }
}

}  // namespace
}  // namespace emu
