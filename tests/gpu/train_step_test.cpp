// One model, unchanged, on the CUDA device against the CPU device: the same losses bit for bit over a few training
// steps, and the same memory accounting (in use, peak, per category).
//
// What this covers today: the CUDA device's memory (managed buffers on the GPU, zero-filled, charged to the same
// cap) under the real model and its optimizer step. The math still runs on the host path (kernels.h), so the
// results must be identical; when the model moves onto emu::Ops this test becomes the GPU-math parity test of a
// full step, with tolerances instead of equality.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "emu/cuda/backend.h"
#include "tests/gpu/gpu_test_support.h"
#include "workloads/model/local_params.h"
#include "workloads/model/model.h"

namespace emu::model {
namespace {

struct Outcome {
  std::vector<float> losses;
  uint64_t peak = 0;
  CategoryBytes peaks;
};

Outcome train(std::string_view backend, Style style, DType dtype) {
  ModelConfig c;
  c.name = "parity";
  c.style = style;
  c.hidden = 64;
  c.ffn = 128;
  c.vocab = 32;
  c.seq = 16;
  c.max_positions = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = style == Style::kLlama ? 2 : 4;
  c.batch = 2;
  c.tie_embeddings = style == Style::kGpt2;
  auto device = make_device(backend, {});
  Outcome outcome;
  {
    Model model(*device, c, {dtype, Attention::kFlash, false});
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

class CudaTrainingStep : public testing::TestWithParam<std::pair<Style, DType>> {};

TEST_P(CudaTrainingStep, MatchesTheCpuDevice) {
  EMU_REQUIRE_GPU();
  const auto [style, dtype] = GetParam();
  const Outcome cpu = train("cpu", style, dtype), gpu = train("cuda", style, dtype);
  EXPECT_EQ(gpu.losses, cpu.losses);
  EXPECT_EQ(gpu.peak, cpu.peak);
  EXPECT_EQ(gpu.peaks.bytes, cpu.peaks.bytes);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaTrainingStep,
                         testing::Values(std::pair{Style::kLlama, DType::kBF16}, std::pair{Style::kGpt2, DType::kF32}));

}  // namespace
}  // namespace emu::model
