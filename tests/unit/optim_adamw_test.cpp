// AdamW: values against hand computation and a double-precision reference, weight decay only inside the decay
// ranges, clipping, sharded updates equal to whole-buffer updates bit for bit, bf16 storage, the lr schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "emu/bf16.h"
#include "emu/check.h"
#include "emu/dtype.h"
#include "workloads/optim/adamw.h"

namespace emu::optim {
namespace {

// One element's AdamW state, stepped in double precision as the formula in adamw.h reads.
struct Reference {
  double w, m = 0, v = 0;
  void step(const AdamWConfig& c, int64_t t, double lr, double g, bool decayed) {
    if (decayed) w *= 1 - lr * c.weight_decay;
    m = c.beta1 * m + (1 - c.beta1) * g;
    v = c.beta2 * v + (1 - c.beta2) * g * g;
    const double m_hat = m / (1 - std::pow(c.beta1, static_cast<double>(t)));
    const double v_hat = v / (1 - std::pow(c.beta2, static_cast<double>(t)));
    w -= lr * m_hat / (std::sqrt(v_hat) + c.eps);
  }
};

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& value : values) value = normal(generator);
  return values;
}

// Flat fp32 state of n elements for direct adamw_update calls.
struct Fp32State {
  std::vector<float> w, m, v;
  explicit Fp32State(std::vector<float> weights) : w(std::move(weights)), m(w.size()), v(w.size()) {}
  AdamWStep step(std::span<const float> grads, int64_t t, float lr) {
    AdamWStep s;
    s.weights = std::span<float>(w);
    s.m = std::span<float>(m);
    s.v = std::span<float>(v);
    s.grads = grads;
    s.step = t;
    s.lr = lr;
    return s;
  }
};

TEST(AdamW, ConstantGradientMovesByLrPerStepAsComputedByHand) {
  // With a constant gradient, m̂ = g and v̂ = g², so every step moves by lr·g/(|g| + ε) ≈ lr·sign(g);
  // decay multiplies by 1 − lr·wd first. lr = 0.1, wd = 0.01:
  //   decayed  w = 1, g = 0.5:   0.999 − 0.1 = 0.899, then 0.899 · 0.999 − 0.1 = 0.798101
  //   plain    w = 1, g = −0.25: 1.1, then 1.2
  AdamWConfig config;
  config.weight_decay = 0.01;
  Fp32State state({1.0f, 1.0f});
  const std::vector<float> grads = {0.5f, -0.25f};
  const std::vector<DecayRange> decay = {{0, 1}};
  for (int64_t t = 1; t <= 2; ++t) {
    AdamWStep step = state.step(grads, t, 0.1f);
    step.decay = decay;
    adamw_update(config, step);
    if (t == 1) {
      EXPECT_NEAR(state.w[0], 0.899f, 1e-6f);
      EXPECT_NEAR(state.w[1], 1.1f, 1e-6f);
      EXPECT_NEAR(state.m[0], 0.05f, 1e-7f);     // (1 − β1) g
      EXPECT_NEAR(state.v[0], 0.00025f, 1e-9f);  // (1 − β2) g²
    }
  }
  EXPECT_NEAR(state.w[0], 0.798101f, 1e-6f);
  EXPECT_NEAR(state.w[1], 1.2f, 1e-6f);
}

// Adam with L2 weight decay (decoupled = false: DeepSpeed's adam_w_mode false, FusedAdam's ADAM_MODE_0,
// torch.optim.Adam's weight_decay): g' = g + wd·w inside a decay range, then Adam on g', no decay of w. By hand,
// lr = 0.1, wd = 0.01, β = 0.9/0.999:
//   decayed  w = 1, g = 0.5:  step 1 g' = 0.51, m̂ = g', v̂ = g'² so w = 1 − 0.1 = 0.9, m = 0.051, v = 0.0002601;
//            step 2 g' = 0.5 + 0.01·0.9 = 0.509, m = 0.9·0.051 + 0.1·0.509 = 0.0968,
//            v = 0.999·0.0002601 + 0.001·0.509² = 0.0005189209, m̂ = 0.0968/0.19 = 0.509474,
//            v̂ = 0.0005189209/0.001999 = 0.259590, √v̂ = 0.509500: w = 0.9 − 0.1·0.509474/0.509500 = 0.800005
//            (AdamW: 0.798101)
//   plain    w = 1, g = −0.25: no decay, as AdamW: 1.1, then 1.2
//   decayed  w = 2, g = 0: g' = 0.02, so Adam moves it by lr: 1.9 (AdamW only decays it: 2·0.999 = 1.998)
TEST(AdamW, L2ModeFoldsWeightDecayIntoTheGradientAsComputedByHand) {
  AdamWConfig config;
  config.weight_decay = 0.01;
  config.decoupled = false;
  Fp32State state({1.0f, 1.0f, 2.0f});
  const std::vector<float> grads = {0.5f, -0.25f, 0.0f};
  const std::vector<DecayRange> decay = {{0, 1}, {2, 3}};
  for (int64_t t = 1; t <= 2; ++t) {
    AdamWStep step = state.step(grads, t, 0.1f);
    step.decay = decay;
    adamw_update(config, step);
    if (t == 1) {
      EXPECT_NEAR(state.w[0], 0.9f, 1e-6f);
      EXPECT_NEAR(state.m[0], 0.051f, 1e-7f);
      EXPECT_NEAR(state.v[0], 0.0002601f, 1e-9f);
      EXPECT_NEAR(state.w[1], 1.1f, 1e-6f);
      EXPECT_NEAR(state.w[2], 1.9f, 1e-6f);
      EXPECT_NEAR(state.m[2], 0.002f, 1e-8f);
    }
  }
  EXPECT_NEAR(state.w[0], 0.800005f, 1e-6f);
  EXPECT_NEAR(state.m[0], 0.0968f, 1e-7f);
  EXPECT_NEAR(state.w[1], 1.2f, 1e-6f);
}

TEST(AdamW, MatchesDoublePrecisionReferenceOverSeveralSteps) {
  AdamWConfig config;
  config.beta2 = 0.95;
  config.weight_decay = 0.1;
  const size_t n = 64;
  Fp32State state(random_values(n, 1, 1.0f));
  std::vector<Reference> reference;
  for (float w : state.w) reference.push_back({w});
  const std::vector<DecayRange> decay = {{8, 20}, {40, 64}};
  auto decayed = [&](size_t i) { return (i >= 8 && i < 20) || i >= 40; };
  for (int64_t t = 1; t <= 5; ++t) {
    const float lr = 0.01f * static_cast<float>(t);
    const std::vector<float> grads = random_values(n, 100 + static_cast<uint32_t>(t), 0.1f);
    AdamWStep step = state.step(grads, t, lr);
    step.decay = decay;
    adamw_update(config, step);
    for (size_t i = 0; i < n; ++i) reference[i].step(config, t, lr, grads[i], decayed(i));
  }
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(state.w[i], reference[i].w, 1e-5 * (1 + std::abs(reference[i].w))) << "element " << i;
    EXPECT_NEAR(state.m[i], reference[i].m, 1e-6) << "element " << i;
    EXPECT_NEAR(state.v[i], reference[i].v, 1e-7) << "element " << i;
  }
}

TEST(AdamW, WeightDecayOnlyInsideDecayRanges) {
  // Zero gradients leave m = v = 0 and the Adam term 0, so only decay moves a weight.
  AdamWConfig config;
  config.weight_decay = 0.5;
  const size_t n = 30;
  const std::vector<DecayRange> decay = {{2, 5}, {5, 7}, {12, 13}, {25, 40}};
  // The shard [10, 40) of a flat buffer: ranges before it, straddling its end and beyond it must all work.
  Fp32State state(std::vector<float>(n, 2.0f));
  const std::vector<float> grads(n, 0.0f);
  AdamWStep step = state.step(grads, 1, 0.1f);
  step.offset = 10;
  step.decay = decay;
  adamw_update(config, step);
  for (size_t i = 0; i < n; ++i) {
    const size_t global = i + 10;
    const bool decayed = global == 12 || global >= 25;
    EXPECT_FLOAT_EQ(state.w[i], decayed ? 2.0f * 0.95f : 2.0f) << "global element " << global;
  }
}

TEST(AdamW, ShardedUpdateEqualsWholeUpdateBitForBit) {
  AdamWConfig config;
  config.weight_decay = 0.1;
  const size_t n = 1000;
  const std::vector<DecayRange> decay = {{0, 300}, {310, 600}, {900, 1000}};
  const std::vector<float> initial = random_values(n, 7, 0.5f);
  Fp32State whole(initial);
  Fp32State sharded(initial);
  std::vector<uint16_t> whole_copy(n), sharded_copy(n);
  const std::vector<size_t> cuts = {0, 377, 600, 601, n};  // shards of 377, 223, 1 and 399 elements
  for (int64_t t = 1; t <= 3; ++t) {
    const std::vector<float> values = random_values(n, 50 + static_cast<uint32_t>(t), 1.0f);
    std::vector<uint16_t> grads(n);
    for (size_t i = 0; i < n; ++i) grads[i] = float_to_bf16(values[i]);
    AdamWStep step = whole.step(std::span<const float>(), t, 1e-2f);
    step.grads = std::span<const uint16_t>(grads);
    step.compute_copy = std::span<uint16_t>(whole_copy);
    step.decay = decay;
    step.grad_scale = 0.5f;
    adamw_update(config, step);
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const size_t begin = cuts[k], count = cuts[k + 1] - cuts[k];
      AdamWStep shard = sharded.step(std::span<const float>(), t, 1e-2f);
      shard.weights = shard.weights.subspan(begin, count);
      shard.m = shard.m.subspan(begin, count);
      shard.v = shard.v.subspan(begin, count);
      shard.grads = ConstElementSpan(std::span<const uint16_t>(grads)).subspan(begin, count);
      shard.compute_copy = ElementSpan(std::span<uint16_t>(sharded_copy)).subspan(begin, count);
      shard.offset = begin;
      shard.decay = decay;
      shard.grad_scale = 0.5f;
      adamw_update(config, shard);
    }
  }
  EXPECT_EQ(whole.w, sharded.w);
  EXPECT_EQ(whole.m, sharded.m);
  EXPECT_EQ(whole.v, sharded.v);
  EXPECT_EQ(whole_copy, sharded_copy);
}

TEST(AdamW, ComputeCopyIsTheBf16RoundingOfTheWeights) {
  AdamWConfig config;
  Fp32State state(random_values(257, 3, 1.0f));
  const std::vector<float> grads = random_values(257, 4, 1.0f);
  std::vector<uint16_t> copy(257);
  AdamWStep step = state.step(grads, 1, 1e-3f);
  step.compute_copy = std::span<uint16_t>(copy);
  adamw_update(config, step);
  size_t inexact = 0;
  for (size_t i = 0; i < copy.size(); ++i) {
    EXPECT_EQ(copy[i], float_to_bf16(state.w[i])) << "element " << i;
    if (bf16_to_float(copy[i]) != state.w[i]) ++inexact;
  }
  EXPECT_GT(inexact, 200u) << "the master weights should keep precision the bf16 copy drops";
}

TEST(AdamW, PureBf16RoundsWeightsAndMomentsOnStore) {
  AdamWConfig config;
  const size_t n = 16;
  const std::vector<float> initial = random_values(n, 9, 1.0f);
  std::vector<uint16_t> w(n), m(n), v(n), g(n);
  std::vector<Reference> reference(n, Reference{0});
  for (size_t i = 0; i < n; ++i) {
    w[i] = float_to_bf16(initial[i]);
    reference[i].w = bf16_to_float(w[i]);
  }
  for (int64_t t = 1; t <= 3; ++t) {
    const std::vector<float> grads = random_values(n, 20 + static_cast<uint32_t>(t), 0.3f);
    for (size_t i = 0; i < n; ++i) g[i] = float_to_bf16(grads[i]);
    AdamWStep step;
    step.weights = std::span<uint16_t>(w);
    step.m = std::span<uint16_t>(m);
    step.v = std::span<uint16_t>(v);
    step.grads = std::span<const uint16_t>(g);
    step.step = t;
    step.lr = 1e-2f;
    adamw_update(config, step);
    // The reference rounds to bf16 wherever the optimizer stores.
    for (size_t i = 0; i < n; ++i) {
      reference[i].step(config, t, 1e-2, bf16_to_float(g[i]), false);
      reference[i].w = round_to_bf16(static_cast<float>(reference[i].w));
      reference[i].m = round_to_bf16(static_cast<float>(reference[i].m));
      reference[i].v = round_to_bf16(static_cast<float>(reference[i].v));
    }
  }
  // fp32 (kernel) and double (reference) arithmetic may round to neighbouring bf16 values: allow 2 bf16 ulps.
  auto near = [](float value, double expected) {
    return std::abs(value - expected) <= std::ldexp(std::abs(expected), -6);
  };
  for (size_t i = 0; i < n; ++i) {
    EXPECT_PRED2(near, bf16_to_float(w[i]), reference[i].w) << "element " << i;
    EXPECT_PRED2(near, bf16_to_float(m[i]), reference[i].m) << "element " << i;
    EXPECT_PRED2(near, bf16_to_float(v[i]), reference[i].v) << "element " << i;
  }
}

TEST(Clipping, SumOfSquaresAndCoefficient) {
  const std::vector<float> grads = {3.0f, 0.0f, -4.0f};
  EXPECT_DOUBLE_EQ(grad_sum_of_squares(std::span<const float>(grads)), 25.0);
  const std::vector<uint16_t> bf16 = {float_to_bf16(3.0f), float_to_bf16(-4.0f)};
  EXPECT_DOUBLE_EQ(grad_sum_of_squares(std::span<const uint16_t>(bf16)), 25.0);
  // Shards' sums add up to the whole's, as an all-reduce of them would.
  const std::vector<float> many = random_values(1001, 11, 1.0f);
  const ConstElementSpan all = std::span<const float>(many);
  EXPECT_NEAR(grad_sum_of_squares(all.subspan(0, 500)) + grad_sum_of_squares(all.subspan(500, 501)),
              grad_sum_of_squares(all), 1e-9);

  EXPECT_FLOAT_EQ(clip_coefficient(5.0, 1.0f), static_cast<float>(1.0 / (5.0 + 1e-6)));
  EXPECT_EQ(clip_coefficient(5.0, 10.0f), 1.0f);
  EXPECT_EQ(clip_coefficient(0.0, 1.0f), 1.0f);
  EXPECT_TRUE(std::isnan(clip_coefficient(std::nan(""), 1.0f)));
}

TEST(Clipping, GradScaleEqualsPrescaledGradients) {
  AdamWConfig config;
  const std::vector<float> initial = random_values(50, 12, 1.0f);
  const std::vector<float> grads = random_values(50, 13, 2.0f);
  const float coefficient = clip_coefficient(std::sqrt(grad_sum_of_squares(std::span<const float>(grads))), 1.0f);
  ASSERT_LT(coefficient, 1.0f);
  std::vector<float> clipped = grads;
  for (float& g : clipped) g *= coefficient;
  Fp32State scaled(initial), prescaled(initial);
  for (int64_t t = 1; t <= 2; ++t) {
    AdamWStep a = scaled.step(grads, t, 1e-2f);
    a.grad_scale = coefficient;
    adamw_update(config, a);
    adamw_update(config, prescaled.step(clipped, t, 1e-2f));
  }
  EXPECT_EQ(scaled.w, prescaled.w);
  EXPECT_EQ(scaled.v, prescaled.v);
}

// DeepSpeed 0.19.8 (torch 2.15.0) WarmupLR, min 1e-5, max 1e-3, 10 steps: the rate each optimizer step used, as
// recorded by scripts/oracle/deepspeed_warmup_lr.py. Steps 1 and 2 both run at the minimum (the scheduler starts at
// iteration −1 and steps after the optimizer).
TEST(LrSchedule, DeepSpeedWarmupLrAsRecorded) {
  const std::vector<double> log_rates = {1e-05,
                                         1e-05,
                                         0.0003080196957073414,
                                         0.00048235004217246576,
                                         0.0006060393914146827,
                                         0.0007019803042926585,
                                         0.0007803697378798071,
                                         0.0008466470596141142,
                                         0.0009040590871220239,
                                         0.0009547000843449315,
                                         0.0009999999999999998,
                                         0.001,
                                         0.001};
  const std::vector<double> linear_rates = {1e-05,    1e-05,    0.000109, 0.000208, 0.000307, 0.000406, 0.000505,
                                            0.000604, 0.000703, 0.000802, 0.000901, 0.001,    0.001};
  LrSchedule schedule;
  schedule.warmup_min_lr = 1e-5;
  schedule.warmup_steps = 10;
  for (const auto& [warmup, rates] : {std::pair{LrSchedule::Warmup::kDeepSpeedLog, log_rates},
                                      std::pair{LrSchedule::Warmup::kDeepSpeedLinear, linear_rates}}) {
    schedule.warmup = warmup;
    for (size_t t = 1; t <= rates.size(); ++t) {
      EXPECT_NEAR(schedule.lr_at(static_cast<int64_t>(t), 1e-3), rates[t - 1], 1e-15) << "step " << t;
    }
  }
}

// DeepSpeed 0.19.8 (torch 2.15.0) WarmupDecayLR, recorded by scripts/oracle/deepspeed_warmup_lr.py: as the Hugging
// Face Trainer fills the Accelerate templates' "auto" (warm-up max(1, 0) steps, min 0, max 1e-3, total 8 = max_steps),
// and with its own log warm-up (4 steps from 1e-5, total 12): after the warm-up a linear decay to the minimum at
// iteration total, step t running at iteration t − 2.
TEST(LrSchedule, DeepSpeedWarmupDecayLrAsRecorded) {
  const std::vector<double> trainer = {0,
                                       0.0,
                                       0.001,
                                       0.001,
                                       0.0008333333333333334,
                                       0.0006666666666666666,
                                       0.0005,
                                       0.0003333333333333333,
                                       0.00016666666666666666,
                                       0.0};
  const std::vector<double> given = {1e-05,
                                     1e-05,
                                     0.000505,
                                     0.0007945564378569724,
                                     0.001,
                                     0.001,
                                     0.0008762500000000001,
                                     0.0007525,
                                     0.00062875,
                                     0.000505,
                                     0.00038125,
                                     0.0002575,
                                     0.00013375,
                                     1e-05,
                                     1e-05};
  LrSchedule schedule;
  schedule.warmup = LrSchedule::Warmup::kDeepSpeedLog;
  schedule.decay = LrSchedule::Decay::kDeepSpeedLinear;
  for (const auto& [min_lr, warmup, total, rates] :
       {std::tuple{0.0, int64_t{1}, int64_t{8}, trainer}, std::tuple{1e-5, int64_t{4}, int64_t{12}, given}}) {
    schedule.warmup_min_lr = min_lr;
    schedule.warmup_steps = warmup;
    schedule.total_steps = total;
    for (size_t t = 1; t <= rates.size(); ++t) {
      EXPECT_NEAR(schedule.lr_at(static_cast<int64_t>(t), 1e-3), rates[t - 1], 1e-15) << "step " << t;
    }
  }
}

TEST(LrSchedule, LinearWarmupThenConstant) {
  LrSchedule schedule;
  schedule.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(schedule.lr_at(1, 1.0), 0.25);
  EXPECT_DOUBLE_EQ(schedule.lr_at(2, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(schedule.lr_at(4, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(schedule.lr_at(1000, 1.0), 1.0);
  schedule.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(schedule.lr_at(1, 2.0), 2.0);
}

TEST(LrSchedule, CosineDecaysToTheMinimum) {
  LrSchedule schedule;
  schedule.decay = LrSchedule::Decay::kCosine;
  schedule.warmup_steps = 10;
  schedule.total_steps = 110;
  schedule.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(schedule.lr_at(5, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(schedule.lr_at(10, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(schedule.lr_at(60, 1.0), 0.55);  // half-way: (1 + 0.1) / 2
  EXPECT_DOUBLE_EQ(schedule.lr_at(110, 1.0), 0.1);
  EXPECT_DOUBLE_EQ(schedule.lr_at(500, 1.0), 0.1);
  EXPECT_GT(schedule.lr_at(30, 1.0), schedule.lr_at(31, 1.0));
}

TEST(LrSchedule, InconsistentSchedulesAndConfigsAreBadInput) {
  LrSchedule schedule;
  schedule.decay = LrSchedule::Decay::kCosine;
  schedule.warmup_steps = 10;
  schedule.total_steps = 10;
  EXPECT_THROW(schedule.validate(), InputError);
  schedule.total_steps = 11;
  EXPECT_NO_THROW(schedule.validate());
  schedule.warmup_steps = -1;
  EXPECT_THROW(schedule.validate(), InputError);

  AdamWConfig config;
  EXPECT_NO_THROW(config.validate());
  config.beta2 = 1.0;
  EXPECT_THROW(config.validate(), InputError);
  config = AdamWConfig{};
  config.eps = 0;
  EXPECT_THROW(config.validate(), InputError);
  config = AdamWConfig{};
  config.lr = -1;
  EXPECT_THROW(config.validate(), InputError);
}

}  // namespace
}  // namespace emu::optim
