// Whole-model checks in fp32: the gradients backward accumulates equal central differences of the loss, for every
// parameter tensor of every unit, in both styles and every attention / checkpointing mode; hook order; gradient
// accumulation; bf16 against fp32.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "emu/device.h"
#include "tests/support/tiny_model.h"
#include "workloads/model/local_params.h"
#include "workloads/model/model.h"
#include "workloads/model/tensor.h"

namespace emu::model {
namespace {

ModelConfig tiny(Style style) { return test::smallest_config(style); }

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch random_batch(const ModelConfig& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b;
  for (int64_t i = 0; i < c.tokens(); ++i) {
    b.tokens.push_back(int32_t(rng() % uint32_t(c.vocab)));
    b.targets.push_back(int32_t(rng() % uint32_t(c.vocab)));
  }
  return b;
}

// Replaces the small initial weights with larger random ones (norm weights near 1) so that every gradient is
// well above the finite-difference noise.
void randomise(Model& model, LocalParams& params, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (int u = 0; u < model.num_units(); ++u) {
    float* w = params.weights(u).as<float>();
    for (const ParamInfo& p : model.layout(u).params) {
      for (size_t i = 0; i < p.count; ++i) w[p.offset + i] = (p.init == Init::kOnes ? 1.0f : 0.0f) + normal(rng);
    }
  }
}

// For every parameter tensor, compares up to 8 of its elements' gradients with central differences.
void check_model_gradients(const ModelConfig& config, const ModelOptions& options) {
  auto device = make_cpu_device({});
  Model model(*device, config, options);
  LocalParams params(model, 1);
  randomise(model, params, 2);
  const Batch batch = random_batch(config, 3);
  NoHooks hooks;
  params.zero_grads();
  model.step(batch.tokens.data(), batch.targets.data(), hooks);
  const double eps = 1e-2;
  for (int u = 0; u < model.num_units(); ++u) {
    float* w = params.weights(u).as<float>();
    const float* g = params.grads(u).as<float>();
    for (const ParamInfo& p : model.layout(u).params) {
      double err2 = 0, ref2 = 0;
      const size_t stride = std::max<size_t>(1, p.count / 8);
      for (size_t i = p.offset; i < p.offset + p.count; i += stride) {
        const float saved = w[i];
        w[i] = saved + float(eps);
        const double plus = model.forward(batch.tokens.data(), batch.targets.data(), hooks);
        w[i] = saved - float(eps);
        const double minus = model.forward(batch.tokens.data(), batch.targets.data(), hooks);
        w[i] = saved;
        const double numeric = (plus - minus) / (2 * eps);
        err2 += (numeric - g[i]) * (numeric - g[i]);
        ref2 += numeric * numeric;
      }
      EXPECT_GT(ref2, 1e-10) << p.name << ": zero gradient proves nothing";
      EXPECT_LT(std::sqrt(err2 / ref2), 1e-2) << p.name;
    }
  }
  model.discard();
}

void check_model_gradients(Style style, const ModelOptions& options) { check_model_gradients(tiny(style), options); }

// Gemma 2: a head dimension of its own (2 heads of 6 for h = 8), the scores scaled by query_pre_attn_scalar^−½ and
// soft-capped, the logits soft-capped, norms on the attention and MLP outputs; caps small enough that tanh bends.
ModelConfig tiny_gemma2() {
  ModelConfig c = tiny(Style::kLlama);
  c.gemma = true;
  c.tie_embeddings = true;
  c.head_size = 6;
  c.query_scale = 5;
  c.attn_softcap = 1.5;
  c.final_softcap = 2;
  c.sandwich_norms = true;
  return c;
}

TEST(ModelGradients, Gemma2Classic) { check_model_gradients(tiny_gemma2(), {DType::kF32, Attention::kEager, false}); }
TEST(ModelGradients, Gemma2FlashCheckpointed) {
  check_model_gradients(tiny_gemma2(), {DType::kF32, Attention::kFlash, true});
}

TEST(ModelGradients, LlamaClassic) { check_model_gradients(Style::kLlama, {DType::kF32, Attention::kEager, false}); }
TEST(ModelGradients, LlamaFlash) { check_model_gradients(Style::kLlama, {DType::kF32, Attention::kFlash, false}); }
TEST(ModelGradients, LlamaCheckpointed) {
  check_model_gradients(Style::kLlama, {DType::kF32, Attention::kEager, true});
}
TEST(ModelGradients, Gpt2Classic) { check_model_gradients(Style::kGpt2, {DType::kF32, Attention::kEager, false}); }
TEST(ModelGradients, Gpt2FlashCheckpointed) {
  check_model_gradients(Style::kGpt2, {DType::kF32, Attention::kFlash, true});
}

TEST(ModelGradients, LlamaTiedHead) {
  ModelConfig config = tiny(Style::kLlama);
  config.tie_embeddings = true;
  auto device = make_cpu_device({});
  Model model(*device, config, {DType::kF32, Attention::kEager, false});
  EXPECT_EQ(model.layout(0).params.size(), 2u) << "a tied head adds no parameter";
}

// Records the hook calls as a string like "F0 F1 f1 F2 f2 f0 B0 B2 b2 B1 b1 b0".
class RecordingHooks final : public Hooks {
 public:
  void before_forward(int unit) override { log += fmt::format("F{} ", unit); }
  void after_forward(int unit) override { log += fmt::format("f{} ", unit); }
  void before_backward(int unit) override { log += fmt::format("B{} ", unit); }
  void after_backward(int unit) override { log += fmt::format("b{} ", unit); }
  std::string log;
};

TEST(ModelHooks, OrderOfUnitsInForwardAndBackward) {
  const ModelConfig config = tiny(Style::kLlama);
  auto device = make_cpu_device({});
  Model model(*device, config, {DType::kF32, Attention::kEager, false});
  LocalParams params(model, 1);
  const Batch batch = random_batch(config, 4);
  RecordingHooks hooks;
  model.step(batch.tokens.data(), batch.targets.data(), hooks);
  EXPECT_EQ(hooks.log, "F0 F1 f1 F2 f2 f0 B0 B2 b2 B1 b1 b0 ");
}

// Every saved activation and temporary is released by the end of backward.
TEST(ModelHooks, BackwardReleasesEverything) {
  for (bool checkpoint : {false, true}) {
    const ModelConfig config = tiny(Style::kGpt2);
    auto device = make_cpu_device({});
    Model model(*device, config, {DType::kBF16, Attention::kEager, checkpoint});
    LocalParams params(model, 1);
    const uint64_t before = device->memory().in_use();
    const Batch batch = random_batch(config, 5);
    NoHooks hooks;
    model.step(batch.tokens.data(), batch.targets.data(), hooks);
    EXPECT_EQ(device->memory().in_use(), before);
    EXPECT_EQ(device->memory().in_use(Category::kActivations), 0u);
    EXPECT_EQ(device->memory().in_use(Category::kTemporaries), 0u);
  }
}

TEST(ModelHooks, BackwardAccumulatesIntoBoundGradients) {
  const ModelConfig config = tiny(Style::kGpt2);
  auto device = make_cpu_device({});
  Model model(*device, config, {DType::kF32, Attention::kEager, false});
  LocalParams params(model, 1);
  const Batch batch = random_batch(config, 6);
  NoHooks hooks;
  model.step(batch.tokens.data(), batch.targets.data(), hooks);
  const std::vector<float> once(params.grads(1).as<float>(), params.grads(1).as<float>() + model.layout(1).count);
  model.step(batch.tokens.data(), batch.targets.data(), hooks);
  const float* twice = params.grads(1).as<float>();
  for (size_t i = 0; i < once.size(); i += 7) EXPECT_NEAR(twice[i], 2 * once[i], 1e-6f + 1e-5f * std::abs(once[i]));
}

// Classic and flash attention, with and without checkpointing, give the same loss and gradients.
TEST(ModelModes, AttentionAndCheckpointingAgree) {
  const ModelConfig config = tiny(Style::kLlama);
  const Batch batch = random_batch(config, 7);
  std::vector<std::vector<float>> grads;
  std::vector<float> losses;
  for (const ModelOptions& options :
       {ModelOptions{DType::kF32, Attention::kEager, false}, ModelOptions{DType::kF32, Attention::kFlash, false},
        ModelOptions{DType::kF32, Attention::kFlash, true}}) {
    auto device = make_cpu_device({});
    Model model(*device, config, options);
    LocalParams params(model, 9);
    NoHooks hooks;
    losses.push_back(model.step(batch.tokens.data(), batch.targets.data(), hooks));
    const float* g = params.grads(1).as<float>();
    grads.emplace_back(g, g + model.layout(1).count);
  }
  for (size_t m = 1; m < grads.size(); ++m) {
    EXPECT_NEAR(losses[m], losses[0], 1e-6);
    for (size_t i = 0; i < grads[0].size(); ++i) ASSERT_NEAR(grads[m][i], grads[0][i], 1e-6) << "mode " << m;
  }
}

// bf16 weights, gradients and activations track the fp32 model closely, and really are bf16 in memory.
TEST(ModelModes, Bf16TracksFp32) {
  const ModelConfig config = tiny(Style::kLlama);
  const Batch batch = random_batch(config, 8);
  float loss[2];
  std::vector<float> grads[2];
  for (int m = 0; m < 2; ++m) {
    const DType dt = m == 0 ? DType::kF32 : DType::kBF16;
    auto device = make_cpu_device({});
    Model model(*device, config, {dt, Attention::kEager, false});
    LocalParams params(model, 11);
    EXPECT_EQ(params.weights(1).bytes(), model.layout(1).count * dtype_size(dt));
    NoHooks hooks;
    loss[m] = model.step(batch.tokens.data(), batch.targets.data(), hooks);
    grads[m].resize(model.layout(1).count);
    widen(params.grads(1).data(), dt, grads[m].size(), grads[m].data());
  }
  EXPECT_NEAR(loss[1], loss[0], 2e-2 * loss[0]);
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) {
    err2 += (grads[1][i] - grads[0][i]) * (grads[1][i] - grads[0][i]);
    ref2 += grads[0][i] * grads[0][i];
  }
  EXPECT_LT(std::sqrt(err2 / ref2), 5e-2);
}

// Initial values depend only on (seed, unit, element): any range equals the same slice of the whole unit.
TEST(ModelInit, AnyRangeMatchesTheWholeUnit) {
  const ModelConfig config = tiny(Style::kGpt2);
  const std::vector<UnitLayout> layouts = build_layouts(config);
  const UnitLayout& unit = layouts[1];
  std::vector<float> whole(unit.count), part(37);
  init_unit_range(unit, 1, 42, 0, unit.count, whole.data());
  init_unit_range(unit, 1, 42, 100, part.size(), part.data());
  for (size_t i = 0; i < part.size(); ++i) EXPECT_EQ(part[i], whole[100 + i]);
  EXPECT_EQ(whole[unit.param("transformer.h.0.ln_1.weight").offset], 1.0f);
  EXPECT_EQ(whole[unit.param("transformer.h.0.attn.c_attn.bias").offset + 2], 0.0f);
  std::vector<float> other(unit.count);
  init_unit_range(unit, 2, 42, 0, unit.count, other.data());
  const size_t w = unit.param("transformer.h.0.attn.c_attn.weight").offset;
  EXPECT_NE(other[w], whole[w]) << "units draw from different streams";
  double sum2 = 0;
  const size_t n = unit.param("transformer.h.0.attn.c_attn.weight").count;
  for (size_t i = w; i < w + n; ++i) sum2 += double(whole[i]) * whole[i];
  EXPECT_NEAR(std::sqrt(sum2 / double(n)), 0.02, 0.004);
}

}  // namespace
}  // namespace emu::model
