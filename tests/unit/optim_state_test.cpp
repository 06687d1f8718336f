// Precision recipes (bytes per parameter by category) and the optimizer state on the device: what it is charged,
// that a shard fits where the whole does not, and that a step through it matches a direct AdamW call.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "emu/bf16.h"
#include "emu/check.h"
#include "emu/device.h"
#include "workloads/optim/adamw_state.h"
#include "workloads/optim/precision.h"
#include "workloads/optim/step_temporaries.h"

namespace emu::optim {
namespace {

MemoryPool::Options uncapped() { return MemoryPool::Options{}; }

TEST(PrecisionRecipe, BytesPerParameterByCategory) {
  const PrecisionRecipe mixed = precision_recipe(Recipe::kMixed);
  EXPECT_EQ(mixed.bytes_per_param(Category::kParameters), 2u);
  EXPECT_EQ(mixed.bytes_per_param(Category::kGradients), 2u);
  EXPECT_EQ(mixed.bytes_per_param(Category::kMasterWeights), 4u);
  EXPECT_EQ(mixed.bytes_per_param(Category::kOptimizerState), 8u);
  EXPECT_EQ(mixed.bytes_per_param(Category::kActivations), 0u);
  EXPECT_EQ(mixed.total_bytes_per_param(), 16u);
  EXPECT_EQ(mixed.optimizer_bytes_per_param(), 12u) << "the ZeRO paper's K";

  const PrecisionRecipe bf16 = precision_recipe(Recipe::kPureBf16);
  EXPECT_EQ(bf16.bytes_per_param(Category::kMasterWeights), 0u);
  EXPECT_EQ(bf16.bytes_per_param(Category::kOptimizerState), 4u);
  EXPECT_EQ(bf16.total_bytes_per_param(), 8u);

  const PrecisionRecipe fp32 = precision_recipe(Recipe::kFp32);
  EXPECT_EQ(fp32.bytes_per_param(Category::kParameters), 4u);
  EXPECT_EQ(fp32.bytes_per_param(Category::kGradients), 4u);
  EXPECT_EQ(fp32.bytes_per_param(Category::kMasterWeights), 0u);
  EXPECT_EQ(fp32.total_bytes_per_param(), 16u);
  EXPECT_EQ(fp32.optimizer_bytes_per_param(), 8u);
}

TEST(PrecisionRecipe, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(parse_precision_recipe("mixed").recipe, Recipe::kMixed);
  EXPECT_EQ(parse_precision_recipe("bf16").recipe, Recipe::kPureBf16);
  EXPECT_EQ(parse_precision_recipe("fp32").recipe, Recipe::kFp32);
  EXPECT_EQ(precision_recipe(Recipe::kPureBf16).name(), "bf16");
  EXPECT_THROW(parse_precision_recipe("fp16"), InputError);
}

TEST(AdamWState, ChargesItsCategoriesPerRecipe) {
  const size_t count = 100;
  for (Recipe recipe : {Recipe::kMixed, Recipe::kPureBf16, Recipe::kFp32}) {
    auto device = make_cpu_device(uncapped());
    const PrecisionRecipe precision = precision_recipe(recipe);
    {
      AdamWState state(*device, precision, count);
      EXPECT_EQ(device->memory().in_use(Category::kOptimizerState),
                count * precision.bytes_per_param(Category::kOptimizerState))
          << precision.name();
      EXPECT_EQ(device->memory().in_use(Category::kMasterWeights),
                count * precision.bytes_per_param(Category::kMasterWeights))
          << precision.name();
      EXPECT_EQ(state.m().dtype(), precision.moments);
      EXPECT_EQ(state.master().empty(), !precision.has_master);
    }
    EXPECT_EQ(device->memory().in_use(), 0u) << "released with the state";
  }
}

TEST(AdamWState, AShardFitsWhereTheWholeDoesNot) {
  // Mixed: 12 bytes per element of optimizer state. 100 elements need 1200 bytes; a quarter shard needs 300.
  MemoryPool::Options options;
  options.cap = 1000;
  auto device = make_cpu_device(options);
  const PrecisionRecipe mixed = precision_recipe(Recipe::kMixed);
  EXPECT_THROW(AdamWState(*device, mixed, 100), OutOfMemoryError);
  AdamWState shard(*device, mixed, 25, "shard 1 of 4");
  EXPECT_EQ(device->memory().in_use(), 300u);
}

TEST(AdamWState, MixedStepUpdatesMasterAndWritesTheBf16Parameters) {
  auto device = make_cpu_device(uncapped());
  const size_t n = 40;
  std::mt19937 generator(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> initial(n), grads(n);
  for (float& w : initial) w = normal(generator);
  for (float& g : grads) g = normal(generator);
  std::vector<uint16_t> grads_bf16(n), params(n);
  for (size_t i = 0; i < n; ++i) {
    grads_bf16[i] = float_to_bf16(grads[i]);
    params[i] = float_to_bf16(initial[i]);
  }

  AdamWState state(*device, precision_recipe(Recipe::kMixed), n);
  state.load_master(std::span<const float>(initial));
  const std::vector<DecayRange> decay = {{100, 120}};  // elements 100..119 of the flat buffer: this shard's 0..19
  AdamWConfig config;
  state.step(config, std::span<uint16_t>(params), std::span<const uint16_t>(grads_bf16), 100, decay, 1e-2f);
  EXPECT_EQ(state.steps_taken(), 1);

  // The same step, called directly.
  std::vector<float> w = initial, m(n), v(n);
  AdamWStep step;
  step.weights = std::span<float>(w);
  step.m = std::span<float>(m);
  step.v = std::span<float>(v);
  step.grads = std::span<const uint16_t>(grads_bf16);
  step.offset = 100;
  step.decay = decay;
  step.lr = 1e-2f;
  adamw_update(config, step);
  const float* master = static_cast<const float*>(state.master().data());
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(master[i], w[i]) << "element " << i;
    EXPECT_EQ(params[i], float_to_bf16(w[i])) << "element " << i;
  }
}

TEST(AdamWState, Fp32StepUpdatesTheParametersInPlace) {
  auto device = make_cpu_device(uncapped());
  AdamWState state(*device, precision_recipe(Recipe::kFp32), 2);
  std::vector<float> params = {1.0f, -1.0f};
  const std::vector<float> grads = {1.0f, -1.0f};
  state.step(AdamWConfig{}, std::span<float>(params), std::span<const float>(grads), 0, {}, 0.1f);
  EXPECT_NEAR(params[0], 0.9f, 1e-6f);
  EXPECT_NEAR(params[1], -0.9f, 1e-6f);
  EXPECT_TRUE(state.master().empty());
}

TEST(AdamWState, ShapesOnlyDeviceChargesButComputesNothing) {
  auto device = make_shapes_device(uncapped());
  AdamWState state(*device, precision_recipe(Recipe::kMixed), 1000);
  EXPECT_EQ(device->memory().in_use(), 12000u);
  ElementSpan params(nullptr, 1000, DType::kBF16);
  ConstElementSpan grads(nullptr, 1000, DType::kBF16);
  state.step(AdamWConfig{}, params, grads, 0, {}, 1e-3f);
  EXPECT_EQ(state.steps_taken(), 1);
}

// torch.optim.AdamW's step temporaries (torch/optim/adam.py), by hand for three tensors of 3, 7 and 5 elements:
// foreach's _foreach_sqrt(exp_avg_sqs) is one new tensor per parameter, 15 elements; the single-tensor loop holds
// exp_avg_sq.sqrt() and its quotient by bias_correction2_sqrt for the largest, 2 × 7; fused allocates nothing. At
// the moments' dtype: 4 bytes in the mixed and fp32 recipes, 2 in pure bf16. Released when the step ends.
TEST(StepTemporaries, ChargeWhatTorchAdamWAllocatesAtStep) {
  const std::vector<uint64_t> tensors = {3, 7, 5};
  struct Want {
    AdamWImpl impl;
    DType state;
    uint64_t bytes;
  };
  for (const Want& want :
       {Want{AdamWImpl::kForeach, DType::kF32, 15 * 4}, Want{AdamWImpl::kForeach, DType::kBF16, 15 * 2},
        Want{AdamWImpl::kSingle, DType::kF32, 2 * 7 * 4}, Want{AdamWImpl::kFused, DType::kF32, 0}}) {
    auto device = make_cpu_device(uncapped());
    {
      const StepTemporaries temporaries(*device, want.impl, tensors, want.state);
      EXPECT_EQ(device->memory().in_use(Category::kOptimizerState), want.bytes) << adamw_impl_name(want.impl);
    }
    EXPECT_EQ(device->memory().in_use(), 0u) << adamw_impl_name(want.impl);
    EXPECT_EQ(device->memory().peak(), want.bytes) << adamw_impl_name(want.impl);
  }
}

}  // namespace
}  // namespace emu::optim
