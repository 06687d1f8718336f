// Finite-difference checks of every layer's backward, in fp32 on tiny shapes, with central differences.
//
// Each check takes an objective f = Σ r ⊙ y (r fixed random) of the layer's output y, so dy = r, and compares the
// layer's analytic gradient of every input with (f(x + ε) − f(x − ε)) / 2ε for every element.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "emu/cpu/attention_kernels.h"
#include "emu/cpu/kernels.h"
#include "workloads/model/rope.h"

namespace emu::cpu {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += double(a[i]) * b[i];
  return sum;
}

// Compares `analytic` (the gradient of f with respect to x) with central differences of f, element by element.
void expect_gradient(const char* what, std::vector<float>& x, const std::function<double()>& f,
                     const std::vector<float>& analytic, double eps = 1e-2) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double err2 = 0, ref2 = 0, worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + float(eps);
    const double plus = f();
    x[i] = saved - float(eps);
    const double minus = f();
    x[i] = saved;
    const double numeric = (plus - minus) / (2 * eps);
    err2 += (numeric - analytic[i]) * (numeric - analytic[i]);
    ref2 += numeric * numeric;
    worst = std::max(worst, std::abs(numeric - analytic[i]));
  }
  EXPECT_GT(ref2, 0) << what << ": the gradient is identically zero, the check proves nothing";
  EXPECT_LT(std::sqrt(err2 / ref2), 2e-3) << what << " (largest element error " << worst << ")";
}

TEST(ModelLayers, LinearBothLayoutsWithBias) {
  const int64_t T = 3, in = 5, out = 4;
  for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    std::vector<float> x = random_vector(T * in, 1), w = random_vector(in * out, 2), b = random_vector(out, 3);
    const std::vector<float> r = random_vector(T * out, 4);
    std::vector<float> y(T * out);
    auto f = [&] {
      linear_forward(x.data(), w.data(), b.data(), y.data(), T, in, out, layout);
      return dot(y, r);
    };
    std::vector<float> dx(T * in, 0), dw(in * out, 0), db(out, 0);
    linear_backward(x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data(), T, in, out, layout, false);
    expect_gradient("linear dx", x, f, dx);
    expect_gradient("linear dw", w, f, dw);
    expect_gradient("linear db", b, f, db);
    // Weight gradients accumulate; dx accumulates only when asked.
    std::vector<float> dx2 = dx, dw2 = dw;
    linear_backward(x.data(), w.data(), r.data(), dx2.data(), dw2.data(), nullptr, T, in, out, layout, true);
    EXPECT_FLOAT_EQ(dw2[3], 2 * dw[3]);
    EXPECT_FLOAT_EQ(dx2[2], 2 * dx[2]);
  }
}

TEST(ModelLayers, RmsNorm) {
  const int64_t T = 3, h = 6;
  std::vector<float> x = random_vector(T * h, 5), w = random_vector(h, 6);
  const std::vector<float> r = random_vector(T * h, 7);
  std::vector<float> y(T * h), rstd(T);
  auto f = [&] {
    rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), T, h, 1e-5f);
    return dot(y, r);
  };
  f();
  std::vector<float> dx(T * h, 0), dw(h, 0);
  rmsnorm_backward(r.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), T, h);
  expect_gradient("rmsnorm dx", x, f, dx);
  expect_gradient("rmsnorm dw", w, f, dw);
}

TEST(ModelLayers, LayerNorm) {
  const int64_t T = 3, h = 6;
  std::vector<float> x = random_vector(T * h, 8), w = random_vector(h, 9), b = random_vector(h, 10);
  const std::vector<float> r = random_vector(T * h, 11);
  std::vector<float> y(T * h), mean(T), rstd(T);
  auto f = [&] {
    layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), T, h, 1e-5f);
    return dot(y, r);
  };
  f();
  std::vector<float> dx(T * h, 0), dw(h, 0), db(h, 0);
  layernorm_backward(r.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), T, h);
  expect_gradient("layernorm dx", x, f, dx);
  expect_gradient("layernorm dw", w, f, dw);
  expect_gradient("layernorm db", b, f, db);
}

TEST(ModelLayers, RotaryEmbeddingFollowsRotateHalf) {
  const int64_t b = 2, s = 4, heads = 2, d = 6;
  std::vector<float> cos(s * d / 2), sin(s * d / 2);
  model::rope_tables(s, model::rope_inverse_frequencies(d, 10000.0, {}, s), cos.data(), sin.data());
  // Hugging Face: out = x·cos(θ) + rotate_half(x)·sin(θ), rotate_half(x) = (−x[d/2:], x[:d/2]), θ_j = pos·θ^(−2j/d).
  std::vector<float> x = random_vector(b * s * heads * d, 12);
  std::vector<float> y = x;
  rope_apply(y.data(), cos.data(), sin.data(), b * s, s, heads, d, d, false);
  const int64_t row = 6, head = 1, pos = row % s;
  for (int64_t j = 0; j < d; ++j) {
    const int64_t pair = j % (d / 2);
    const double angle = double(pos) * std::pow(10000.0, -2.0 * double(pair) / double(d));
    const float* v = x.data() + (row * heads + head) * d;
    const double rotated = j < d / 2 ? -v[j + d / 2] : v[j - d / 2];
    EXPECT_NEAR(y[(row * heads + head) * d + j], v[j] * std::cos(angle) + rotated * std::sin(angle), 1e-5);
  }
  const std::vector<float> r = random_vector(x.size(), 13);
  auto f = [&] {
    y = x;
    rope_apply(y.data(), cos.data(), sin.data(), b * s, s, heads, d, d, false);
    return dot(y, r);
  };
  std::vector<float> dx = r;
  rope_apply(dx.data(), cos.data(), sin.data(), b * s, s, heads, d, d, true);
  expect_gradient("rope dx", x, f, dx);
}

// Phi-4-mini's partial rotary embedding (transformers phi3 apply_rotary_pos_emb): the first rotary_dim dimensions
// of each head turn as a head of that size would (frequencies θ^(−2j/rotary_dim)), the others pass through.
TEST(ModelLayers, PartialRotaryTurnsTheFirstDimensionsOnly) {
  const int64_t b = 1, s = 5, heads = 3, d = 8, rotary = 6;
  std::vector<float> cos(s * rotary / 2), sin(s * rotary / 2);
  model::rope_tables(s, model::rope_inverse_frequencies(rotary, 10000.0, {}, s), cos.data(), sin.data());
  const std::vector<float> x = random_vector(b * s * heads * d, 21);
  std::vector<float> y = x;
  rope_apply(y.data(), cos.data(), sin.data(), b * s, s, heads, d, rotary, false);
  const int64_t row = 3, head = 2, pos = row % s;
  const float* v = x.data() + (row * heads + head) * d;
  for (int64_t j = 0; j < d; ++j) {
    double expected = v[j];
    if (j < rotary) {
      const int64_t pair = j % (rotary / 2);
      const double angle = double(pos) * std::pow(10000.0, -2.0 * double(pair) / double(rotary));
      const double rotated = j < rotary / 2 ? -v[j + rotary / 2] : v[j - rotary / 2];
      expected = v[j] * std::cos(angle) + rotated * std::sin(angle);
    }
    EXPECT_NEAR(y[(row * heads + head) * d + j], expected, 1e-5) << "dimension " << j;
  }
  const std::vector<float> r = random_vector(x.size(), 22);
  std::vector<float> in = x;
  auto f = [&] {
    y = in;
    rope_apply(y.data(), cos.data(), sin.data(), b * s, s, heads, d, rotary, false);
    return dot(y, r);
  };
  std::vector<float> dx = r;
  rope_apply(dx.data(), cos.data(), sin.data(), b * s, s, heads, d, rotary, true);
  expect_gradient("partial rope dx", in, f, dx);
}

TEST(ModelLayers, GeluTanhApproximation) {
  std::vector<float> x = random_vector(20, 14, 2.0f);
  std::vector<float> y(20);
  gelu_forward(x.data(), y.data(), 1);
  const double v = x[0];
  EXPECT_NEAR(y[0], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-6);
  const std::vector<float> r = random_vector(20, 15);
  auto f = [&] {
    gelu_forward(x.data(), y.data(), x.size());
    return dot(y, r);
  };
  std::vector<float> dx(20);
  gelu_backward(r.data(), x.data(), dx.data(), x.size());
  expect_gradient("gelu dx", x, f, dx);
}

TEST(ModelLayers, SwiGlu) {
  std::vector<float> g = random_vector(20, 16, 2.0f), u = random_vector(20, 17);
  const std::vector<float> r = random_vector(20, 18);
  std::vector<float> y(20);
  auto f = [&] {
    swiglu_forward(g.data(), u.data(), y.data(), g.size());
    return dot(y, r);
  };
  std::vector<float> dg(20), du(20);
  swiglu_backward(r.data(), g.data(), u.data(), dg.data(), du.data(), g.size());
  expect_gradient("swiglu dgate", g, f, dg);
  expect_gradient("swiglu dup", u, f, du);
}

TEST(ModelLayers, EmbeddingWithPositions) {
  const int64_t b = 2, s = 3, V = 5, h = 4;
  const std::vector<int32_t> tokens = {1, 4, 1, 0, 2, 4};
  std::vector<float> table = random_vector(V * h, 19), positions = random_vector(s * h, 20);
  const std::vector<float> r = random_vector(b * s * h, 21);
  std::vector<float> y(b * s * h);
  auto f = [&] {
    embedding_forward(tokens.data(), table.data(), positions.data(), y.data(), b * s, s, h);
    return dot(y, r);
  };
  std::vector<float> dt(V * h, 0), dp(s * h, 0);
  embedding_backward(tokens.data(), r.data(), dt.data(), dp.data(), b * s, s, h);
  expect_gradient("embedding dtable", table, f, dt);
  expect_gradient("embedding dpositions", positions, f, dp);
}

TEST(ModelLayers, CrossEntropy) {
  const int64_t T = 4, V = 7;
  std::vector<float> logits = random_vector(T * V, 22, 2.0f);
  const std::vector<int32_t> targets = {0, 6, 3, 3};
  auto f = [&] {
    std::vector<float> work = logits;
    return cross_entropy(work.data(), targets.data(), T, V, 1.0f);
  };
  std::vector<float> grad = logits;
  const double loss = cross_entropy(grad.data(), targets.data(), T, V, 1.0f);
  double expected = 0;
  for (int64_t t = 0; t < T; ++t) {
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(logits[t * V + j]));
    expected += std::log(sum) - logits[t * V + targets[t]];
  }
  EXPECT_NEAR(loss, expected, 1e-5);
  expect_gradient("cross-entropy dlogits", logits, f, grad);
}

// Attention with grouped-query heads (a = 4, kv = 2), over 2 sequences, optionally inside a wider fused tensor.
void check_attention(bool flash, bool fused) {
  const int64_t b = 2, s = 5, a = 4, kv = 2, d = 3, T = b * s;
  AttentionShape shape{b, s, a, kv, d, 0, 0};
  // Fused: q | k | v as column blocks of one [T, (a + 2·kv)·d] tensor, as GPT-2's c_attn output is.
  const int64_t width = fused ? (a + 2 * kv) * d : 0;
  if (fused) shape.q_stride = shape.kv_stride = width;
  std::vector<float> q = random_vector(fused ? T * width : T * a * d, 23), k = random_vector(T * kv * d, 24),
                     v = random_vector(T * kv * d, 25);
  const float* kp = fused ? q.data() + a * d : k.data();
  const float* vp = fused ? q.data() + (a + kv) * d : v.data();
  const std::vector<float> r = random_vector(T * a * d, 26);
  std::vector<float> out(T * a * d), probs(b * a * s * s), lse(b * a * s);
  auto f = [&] {
    if (flash) {
      attention_forward_flash(shape, q.data(), kp, vp, out.data(), lse.data());
    } else {
      attention_forward_classic(shape, q.data(), kp, vp, probs.data(), out.data());
    }
    return dot(out, r);
  };
  f();
  if (flash) {  // the flash output equals the classic one
    std::vector<float> classic(out.size());
    attention_forward_classic(shape, q.data(), kp, vp, probs.data(), classic.data());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], classic[i], 1e-5);
  }
  std::vector<float> dq(q.size(), 0), dk(k.size(), 0), dv(v.size(), 0), dscores(probs.size());
  float* dkp = fused ? dq.data() + a * d : dk.data();
  float* dvp = fused ? dq.data() + (a + kv) * d : dv.data();
  if (flash) {
    attention_backward_flash(shape, q.data(), kp, vp, out.data(), lse.data(), r.data(), dq.data(), dkp, dvp);
  } else {
    attention_backward_classic(shape, q.data(), kp, vp, probs.data(), out.data(), r.data(), dq.data(), dkp, dvp,
                               dscores.data());
  }
  expect_gradient(fused ? "attention d(qkv)" : "attention dq", q, f, dq);
  if (!fused) {
    expect_gradient("attention dk", k, f, dk);
    expect_gradient("attention dv", v, f, dv);
  }
  // Causality: the first token of a sequence attends only to itself, so its output is its own value row.
  for (int64_t e = 0; e < d; ++e) EXPECT_NEAR(out[e], vp[e], 1e-6);
}

TEST(ModelLayers, AttentionClassicGqa) { check_attention(false, false); }
TEST(ModelLayers, AttentionFlashGqa) { check_attention(true, false); }
TEST(ModelLayers, AttentionClassicFusedQkv) { check_attention(false, true); }
TEST(ModelLayers, AttentionFlashFusedQkv) { check_attention(true, true); }

}  // namespace
}  // namespace emu::cpu
