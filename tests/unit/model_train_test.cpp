// Training a tiny model with the single-device reference (plain SGD) on a learnable token stream lowers the loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "emu/device.h"
#include "tests/support/tiny_model.h"
#include "workloads/model/local_params.h"
#include "workloads/model/model.h"

namespace emu::model {
namespace {

// Sequences of a deterministic chain t' = (3t + 1) mod V from a random start: every target is a function of its
// input token, so the loss can fall from ln V towards 0.
void chain_batch(const ModelConfig& c, std::mt19937& rng, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
  tokens.resize(size_t(c.tokens()));
  targets.resize(tokens.size());
  for (int64_t b = 0; b < c.batch; ++b) {
    int32_t t = int32_t(rng() % uint32_t(c.vocab));
    for (int64_t i = 0; i < c.seq; ++i) {
      const size_t at = size_t(b * c.seq + i);
      tokens[at] = t;
      t = int32_t((3 * t + 1) % c.vocab);
      targets[at] = t;
    }
  }
}

void expect_learns(Style style, DType dtype) {
  const ModelConfig c = test::tiny_config(style);
  auto device = make_cpu_device({});
  Model model(*device, c, {dtype, Attention::kFlash, false});
  LocalParams params(model, 5);
  std::mt19937 rng(6);
  std::vector<int32_t> tokens, targets;
  float first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    chain_batch(c, rng, tokens, targets);
    const float loss = params.train_step(tokens.data(), targets.data(), 0.5f);
    ASSERT_TRUE(std::isfinite(loss));
    if (step == 0) first = loss;
    last = loss;
  }
  std::printf("%s %s: loss %.3f -> %.3f after 150 SGD steps (ln V = %.3f)\n", style_name(style).data(),
              dtype_name(dtype).data(), first, last, std::log(16.0));
  EXPECT_NEAR(first, std::log(16.0), 0.1) << "an untrained model is near uniform";
  EXPECT_LT(last, 0.5f * first);
}

TEST(ModelTraining, LlamaFp32LowersTheLoss) { expect_learns(Style::kLlama, DType::kF32); }
TEST(ModelTraining, Gpt2Fp32LowersTheLoss) { expect_learns(Style::kGpt2, DType::kF32); }
TEST(ModelTraining, LlamaBf16LowersTheLoss) { expect_learns(Style::kLlama, DType::kBF16); }

}  // namespace
}  // namespace emu::model
