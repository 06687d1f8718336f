// One model, unchanged, on the CUDA device against the CPU device: the same losses within tolerance over a few
// training steps, and the same memory accounting (in use, peak, per category) to the byte.
//
// The model computes through the device's ops (Device::ops): CUDA kernels and cuBLAS here, the CPU kernels on
// the cpu device. Tolerance: 1e-4 relative per loss, from the per-op tolerances of ops_parity_test.cpp (matrix
// products 1e-4 with sums in another order) over three SGD steps of a two-block model; the accounting is the same
// on both backends, since the fp32 working copies are scratch on both and not charged.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "emu/backend.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/support/tiny_model.h"
#include "workloads/model/local_params.h"
#include "workloads/model/model.h"

namespace emu::model {
namespace {

struct Outcome {
  std::vector<float> losses;
  uint64_t peak = 0;
  CategoryBytes peaks;
};

struct Case {
  Style style;
  DType dtype;
  Attention attention;
};

Outcome train(std::string_view backend, const Case& k) {
  const ModelConfig c = test::tiny_config(k.style, {.hidden = 64, .ffn = 128, .vocab = 32, .batch = 2});
  auto device = make_device(backend, {});
  Outcome outcome;
  {
    Model model(*device, c, {k.dtype, k.attention, false});
    LocalParams params(model, 5);
    std::mt19937 rng(6);
    std::vector<int32_t> tokens(size_t(c.tokens())), targets(tokens.size());
    for (int step = 0; step < 3; ++step) {
      for (auto& t : tokens) t = int32_t(rng() % uint32_t(c.vocab));
      for (auto& t : targets) t = int32_t(rng() % uint32_t(c.vocab));
      outcome.losses.push_back(params.train_step(tokens.data(), targets.data(), 0.1f));
    }
    outcome.peak = device->memory().peak();
    outcome.peaks = device->memory().category_peaks();
  }
  EXPECT_EQ(device->memory().in_use(), 0u) << backend << ": every buffer released";
  return outcome;
}

class CudaTrainingStep : public testing::TestWithParam<Case> {};

TEST_P(CudaTrainingStep, MatchesTheCpuDevice) {
  EMU_REQUIRE_GPU();
  const Outcome cpu = train("cpu", GetParam()), gpu = train("cuda", GetParam());
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-4 * std::abs(cpu.losses[i])) << "step " << i + 1;
  }
  EXPECT_EQ(gpu.peak, cpu.peak);
  EXPECT_EQ(gpu.peaks.bytes, cpu.peaks.bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaTrainingStep,
                         testing::Values(Case{Style::kLlama, DType::kBF16, Attention::kFlash},
                                         Case{Style::kGpt2, DType::kF32, Attention::kFlash},
                                         Case{Style::kLlama, DType::kF32, Attention::kEager}));

}  // namespace
}  // namespace emu::model
