// The model and the optimizer compute only through the device's ops (emu/ops.h): a device that brings its own ops
// (as a CUDA device does) gets every op of a training step, forward, backward and AdamW, and the same numbers as the
// cpu device. Its ops here are the CPU's behind a counter, so the results must be identical bit for bit, and its
// scratch must be returned in full.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "emu/cpu/cpu_ops.h"
#include "emu/device.h"
#include "emu/ops.h"
#include "tests/support/tiny_model.h"
#include "workloads/model/local_params.h"
#include "workloads/model/model.h"
#include "workloads/optim/adamw_state.h"
#include "workloads/optim/precision.h"

namespace emu::model {
namespace {

// The CPU ops, counted by name, with the scratch bytes outstanding.
class CountingOps final : public Ops {
 public:
  std::map<std::string, int> calls;
  int64_t scratch_outstanding = 0;

  std::string_view backend() const override { return "counting"; }
  void synchronize() override { ++calls["synchronize"]; }
  void bf16_to_f32(const uint16_t* x, float* y, size_t n) override { h("bf16_to_f32").bf16_to_f32(x, y, n); }
  void f32_to_bf16(const float* x, uint16_t* y, size_t n) override { h("f32_to_bf16").f32_to_bf16(x, y, n); }
  void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t r, int64_t i, int64_t o,
                      WeightLayout l) override {
    h("linear_forward").linear_forward(x, w, b, y, r, i, o, l);
  }
  void linear_forward_bf16(const uint16_t* x, const uint16_t* w, const float* b, float* y, int64_t r, int64_t i,
                           int64_t o, WeightLayout l) override {
    h("linear_forward_bf16").linear_forward_bf16(x, w, b, y, r, i, o, l);
  }
  void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t r,
                       int64_t i, int64_t o, WeightLayout l, bool acc) override {
    h("linear_backward").linear_backward(x, w, dy, dx, dw, db, r, i, o, l, acc);
  }
  void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t r, int64_t d,
                       float eps) override {
    h("rmsnorm_forward").rmsnorm_forward(x, w, y, rstd, r, d, eps);
  }
  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                        int64_t r, int64_t d) override {
    h("rmsnorm_backward").rmsnorm_backward(dy, x, w, rstd, dx, dw, r, d);
  }
  void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t r,
                         int64_t d, float eps) override {
    h("layernorm_forward").layernorm_forward(x, w, b, y, mean, rstd, r, d, eps);
  }
  void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                          float* dx, float* dw, float* db, int64_t r, int64_t d) override {
    h("layernorm_backward").layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, r, d);
  }
  void rope_apply(float* x, const float* cos, const float* sin, int64_t r, int64_t s, int64_t heads, int64_t d,
                  int64_t rotary, bool backward) override {
    h("rope_apply").rope_apply(x, cos, sin, r, s, heads, d, rotary, backward);
  }
  void gelu_forward(const float* x, float* y, size_t n) override { h("gelu_forward").gelu_forward(x, y, n); }
  void gelu_backward(const float* dy, const float* x, float* dx, size_t n) override {
    h("gelu_backward").gelu_backward(dy, x, dx, n);
  }
  void swiglu_forward(const float* g, const float* u, float* y, size_t n) override {
    h("swiglu_forward").swiglu_forward(g, u, y, n);
  }
  void swiglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) override {
    h("swiglu_backward").swiglu_backward(dy, g, u, dg, du, n);
  }
  void geglu_forward(const float* g, const float* u, float* y, size_t n) override {
    h("geglu_forward").geglu_forward(g, u, y, n);
  }
  void geglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) override {
    h("geglu_backward").geglu_backward(dy, g, u, dg, du, n);
  }
  void scale(float* y, float alpha, size_t n) override { h("scale").scale(y, alpha, n); }
  void softcap_forward(float* y, float* t, float cap, size_t n) override {
    h("softcap_forward").softcap_forward(y, t, cap, n);
  }
  void softcap_backward(float* dy, const float* t, size_t n) override {
    h("softcap_backward").softcap_backward(dy, t, n);
  }
  void embedding_forward(const int32_t* t, const float* table, const float* pos, float* y, int64_t r, int64_t s,
                         int64_t d) override {
    h("embedding_forward").embedding_forward(t, table, pos, y, r, s, d);
  }
  void embedding_backward(const int32_t* t, const float* dy, float* dtable, float* dpos, int64_t r, int64_t s,
                          int64_t d) override {
    h("embedding_backward").embedding_backward(t, dy, dtable, dpos, r, s, d);
  }
  double cross_entropy(float* logits, const int32_t* targets, int64_t r, int64_t v, float scale) override {
    return h("cross_entropy").cross_entropy(logits, targets, r, v, scale);
  }
  void attention_forward_classic(const AttentionShape& s, const float* q, const float* k, const float* v, float* probs,
                                 float* out) override {
    h("attention_forward_classic").attention_forward_classic(s, q, k, v, probs, out);
  }
  void attention_backward_classic(const AttentionShape& s, const float* q, const float* k, const float* v,
                                  const float* probs, const float* out, const float* dout, float* dq, float* dk,
                                  float* dv, float* dscores) override {
    h("attention_backward_classic").attention_backward_classic(s, q, k, v, probs, out, dout, dq, dk, dv, dscores);
  }
  void attention_forward_flash(const AttentionShape& s, const float* q, const float* k, const float* v, float* out,
                               float* lse) override {
    h("attention_forward_flash").attention_forward_flash(s, q, k, v, out, lse);
  }
  void attention_backward_flash(const AttentionShape& s, const float* q, const float* k, const float* v,
                                const float* out, const float* lse, const float* dout, float* dq, float* dk,
                                float* dv) override {
    h("attention_backward_flash").attention_backward_flash(s, q, k, v, out, lse, dout, dq, dk, dv);
  }
  void add(const float* a, const float* b, float* y, size_t n) override { h("add").add(a, b, y, n); }
  void accumulate(float* y, const float* x, size_t n) override { h("accumulate").accumulate(y, x, n); }
  void accumulate_bf16(uint16_t* y, const float* x, size_t n) override {
    h("accumulate_bf16").accumulate_bf16(y, x, n);
  }
  void adamw(const AdamWOp& op) override { h("adamw").adamw(op); }
  void* scratch_allocate(size_t bytes, bool zero) override {
    scratch_outstanding += int64_t(bytes);
    return h("scratch_allocate").scratch_allocate(bytes, zero);
  }
  void scratch_free(void* data, size_t bytes) override {
    scratch_outstanding -= int64_t(bytes);
    h("scratch_free").scratch_free(data, bytes);
  }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    h("copy_from_host").copy_from_host(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) override { h("fill_zero").fill_zero(dst, bytes); }

 private:
  Ops& h(const char* name) {
    ++calls[name];
    return cpu::cpu_ops();
  }
};

// Host memory like the cpu backend's, but a backend with ops of its own.
class OwnOpsDevice final : public Device {
 public:
  OwnOpsDevice() : Device(MemoryPool::Options{}) {}
  std::string_view backend() const override { return "own-ops"; }
  bool holds_data() const override { return true; }
  Ops* ops() override { return &ops_; }
  CountingOps& counting() { return ops_; }

 protected:
  void* raw_allocate(size_t bytes) override { return std::calloc(bytes == 0 ? 1 : bytes, 1); }
  void raw_free(void* data, size_t) override { std::free(data); }

 private:
  CountingOps ops_;
};

struct Case {
  Style style;
  DType dtype;
  Attention attention;
};

ModelConfig tiny(Style style) { return test::tiny_config(style, {.seq = 8, .batch = 2}); }

// Two SGD steps of the tiny model, then one AdamW step over unit 1's weights, on `device`.
std::vector<float> train(Device& device, const Case& k) {
  const ModelConfig c = tiny(k.style);
  std::vector<float> results;
  Model model(device, c, {k.dtype, k.attention, true});
  LocalParams params(model, 3);
  std::mt19937 rng(4);
  std::vector<int32_t> tokens(size_t(c.tokens())), targets(tokens.size());
  for (int step = 0; step < 2; ++step) {
    for (auto& t : tokens) t = int32_t(rng() % uint32_t(c.vocab));
    for (auto& t : targets) t = int32_t(rng() % uint32_t(c.vocab));
    results.push_back(params.train_step(tokens.data(), targets.data(), 0.1f));
  }
  const size_t n = model.layout(1).count;
  optim::AdamWState state(device, optim::parse_precision_recipe("fp32"), n);
  Buffer weights = device.allocate(n, DType::kF32, Category::kParameters, "weights");
  Buffer grads = device.allocate(n, DType::kF32, Category::kGradients, "grads");
  for (size_t i = 0; i < n; ++i) grads.as<float>()[i] = float(i % 7) - 3.0f;
  const optim::DecayRange decay[] = {{n / 4, n / 2}};
  state.step({}, optim::ElementSpan::of(weights), optim::ConstElementSpan::of(grads), 0, decay, 1e-2);
  results.insert(results.end(), weights.as<float>(), weights.as<float>() + n);
  return results;
}

class OwnOps : public testing::TestWithParam<Case> {};

TEST_P(OwnOps, EveryOpOfAStepGoesThroughTheDevicesOps) {
  const Case k = GetParam();
  auto cpu = make_cpu_device({});
  OwnOpsDevice own;
  const std::vector<float> expected = train(*cpu, k), got = train(own, k);
  EXPECT_EQ(got, expected) << "the same ops, so the same bits";
  EXPECT_EQ(own.memory().in_use(), 0u);
  const CountingOps& ops = own.counting();
  EXPECT_EQ(ops.scratch_outstanding, 0) << "every scratch allocation returned";
  const bool llama = k.style == Style::kLlama, flash = k.attention == Attention::kFlash;
  for (const char* name :
       {"linear_forward", "linear_backward", "embedding_forward", "embedding_backward", "cross_entropy", "accumulate",
        "copy_from_host", "adamw", "synchronize", llama ? "rmsnorm_forward" : "layernorm_forward",
        llama ? "rmsnorm_backward" : "layernorm_backward", llama ? "swiglu_forward" : "gelu_forward",
        llama ? "swiglu_backward" : "gelu_backward", flash ? "attention_forward_flash" : "attention_forward_classic",
        flash ? "attention_backward_flash" : "attention_backward_classic"}) {
    EXPECT_GT(ops.calls.count(name) ? ops.calls.at(name) : 0, 0) << name << " never called";
  }
  if (llama) {
    EXPECT_GT(ops.calls.count("rope_apply") ? ops.calls.at("rope_apply") : 0, 0);
  }
  if (k.dtype == DType::kBF16) {
    for (const char* name : {"bf16_to_f32", "f32_to_bf16", "accumulate_bf16", "scratch_allocate"}) {
      EXPECT_GT(ops.calls.count(name) ? ops.calls.at(name) : 0, 0) << name << " never called";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, OwnOps,
                         testing::Values(Case{Style::kLlama, DType::kBF16, Attention::kFlash},
                                         Case{Style::kLlama, DType::kF32, Attention::kEager},
                                         Case{Style::kGpt2, DType::kBF16, Attention::kEager},
                                         Case{Style::kGpt2, DType::kF32, Attention::kFlash}));

}  // namespace
}  // namespace emu::model
