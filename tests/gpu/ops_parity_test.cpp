// Every CUDA op (emu/cuda/cuda_ops.cu, attention.cu) against the CPU kernels it replaces (emu/cpu/kernels.h,
// attention_kernels.h, and optim/adamw.h's update, which runs emu/cpu/adamw.h), and the ops' memory helpers
// (scratch, host copies, zero fill).
//
// Tolerances (|gpu − cpu| ≤ atol + rtol·|cpu|), chosen from how the two sides compute:
//   exact (0, 0)        casts (same rounding bit for bit), embedding forward/backward, add, accumulate,
//                       accumulate_bf16 (the same additions in the same order, one bf16 rounding)
//   1e-6, 1e-6          rotary embedding (the same products; FMA contraction may differ by an ulp)
//   1e-6, 1e-5          GELU, SwiGLU (CUDA's expf/tanhf against Eigen's vectorised exp/tanh, a few ulp each)
//   1e-5, 1e-5          norms (row sums in double on both sides, summed in another order)
//   1e-4, 1e-4          matrix products, K ≤ 128 with inputs in [−1, 1] (cuBLAS and OpenBLAS sum in different
//                       orders; fp32 accumulation on both, TF32 off), cross-entropy's dlogits and loss
//   1e-5, 1e-4          attention, classic and flash, forward (probs, lse, out) and backward (dS, dq, dk, dv),
//                       s ≤ 17, d = 8, inputs in [−1, 1]: per-thread dot products and softmax sums against OpenBLAS
//                       and Eigen, in other orders; D = rowsum(dout ⊙ out) in double on the GPU, float on the CPU
//   1e-6, 1e-6 / 1 ulp  AdamW fp32 state / bf16 state (one bf16 rounding step apart at most)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <vector>

#include "emu/bf16.h"
#include "emu/cpu/attention_kernels.h"
#include "emu/cpu/kernels.h"
#include "emu/dtype.h"
#include "emu/ops.h"
#include "tests/gpu/gpu_test_support.h"
#include "workloads/model/rope.h"
#include "workloads/optim/adamw.h"

namespace emu {
namespace {

namespace k = cpu;
using test::DeviceArray;

std::vector<float> random_floats(size_t n, uint32_t seed, float low = -1, float high = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> values(n);
  for (float& v : values) v = dist(rng);
  return values;
}

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> values(n);
  for (int32_t& v : values) v = dist(rng);
  return values;
}

void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double atol, double rtol,
                  const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double diff = std::abs(double(gpu[i]) - double(cpu[i]));
    if (!(diff <= atol + rtol * std::abs(double(cpu[i])))) {
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << ", cpu " << cpu[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << cpu.size() << " elements outside tolerance";
}

class CudaOpsParity : public testing::Test {
 protected:
  void SetUp() override {
    EMU_REQUIRE_GPU();
    ops_ = cuda::make_cuda_ops(0);
  }
  std::unique_ptr<Ops> ops_;
};

TEST_F(CudaOpsParity, CastsRoundLikeTheHost) {
  std::vector<float> x = random_floats(4099, 1, -1e3f, 1e3f);
  x.insert(x.end(), {0.0f, -0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                     1.00390625f /* a tie */, 1.01171875f, 3.4e38f, 1e-40f});
  DeviceArray<float> dx(x);
  DeviceArray<uint16_t> dy(x.size());
  ops_->f32_to_bf16(dx, dy, x.size());
  const std::vector<uint16_t> bits = dy.back();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits[i], float_to_bf16(x[i])) << "element " << i << " = " << x[i];
  DeviceArray<float> back(x.size());
  ops_->bf16_to_f32(dy, back, x.size());
  const std::vector<float> widened = back.back();
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = bf16_to_float(bits[i]);
    ASSERT_TRUE(std::memcmp(&widened[i], &want, sizeof(float)) == 0) << "element " << i;
  }
}

class CudaLinearParity : public CudaOpsParity, public testing::WithParamInterface<WeightLayout> {};

TEST_P(CudaLinearParity, ForwardWithBias) {
  const int64_t rows = 37, in = 96, out = 80;
  const auto x = random_floats(rows * in, 2), w = random_floats(in * out, 3), b = random_floats(out, 4);
  std::vector<float> want(rows * out);
  k::linear_forward(x.data(), w.data(), b.data(), want.data(), rows, in, out, GetParam());
  DeviceArray<float> dx(x), dw(w), db(b), dy(rows * out);
  ops_->linear_forward(dx, dw, db, dy, rows, in, out, GetParam());
  expect_close(dy.back(), want, 1e-4, 1e-4, "linear_forward");
}

TEST_P(CudaLinearParity, ForwardBf16InputsAccumulateInFp32) {
  const int64_t rows = 33, in = 128, out = 64;
  auto x = random_floats(rows * in, 5), w = random_floats(in * out, 6);
  std::vector<uint16_t> xb(x.size()), wb(w.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(xb[i] = float_to_bf16(x[i]));
  for (size_t i = 0; i < w.size(); ++i) w[i] = bf16_to_float(wb[i] = float_to_bf16(w[i]));
  std::vector<float> want(rows * out);
  k::linear_forward(x.data(), w.data(), nullptr, want.data(), rows, in, out, GetParam());
  DeviceArray<uint16_t> dx(xb), dw(wb);
  DeviceArray<float> dy(rows * out);
  ops_->linear_forward_bf16(dx, dw, nullptr, dy, rows, in, out, GetParam());
  expect_close(dy.back(), want, 1e-4, 1e-4, "linear_forward_bf16");
}

TEST_P(CudaLinearParity, BackwardAccumulatesWeightAndBiasGradients) {
  const int64_t rows = 29, in = 72, out = 48;
  const auto x = random_floats(rows * in, 7), w = random_floats(in * out, 8), dy = random_floats(rows * out, 9);
  for (bool accumulate_dx : {false, true}) {
    auto dx = random_floats(rows * in, 10), dw = random_floats(in * out, 11), db = random_floats(out, 12);
    DeviceArray<float> gx(x), gw(w), gdy(dy), gdx(dx), gdw(dw), gdb(db);
    k::linear_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), rows, in, out, GetParam(),
                       accumulate_dx);
    ops_->linear_backward(gx, gw, gdy, gdx, gdw, gdb, rows, in, out, GetParam(), accumulate_dx);
    expect_close(gdx.back(), dx, 1e-4, 1e-4, "dx");
    expect_close(gdw.back(), dw, 1e-4, 1e-4, "dw");
    expect_close(gdb.back(), db, 1e-4, 1e-4, "dbias");
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaLinearParity, testing::Values(WeightLayout::kOutIn, WeightLayout::kInOut));

TEST_F(CudaOpsParity, RmsNormForwardAndBackward) {
  const int64_t rows = 19, dim = 300;
  const auto x = random_floats(rows * dim, 13), w = random_floats(dim, 14), dy = random_floats(rows * dim, 15);
  std::vector<float> y(rows * dim), rstd(rows);
  k::rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, dim, 1e-5f);
  DeviceArray<float> gx(x), gw(w), gy(rows * dim), grstd(rows);
  ops_->rmsnorm_forward(gx, gw, gy, grstd, rows, dim, 1e-5f);
  expect_close(gy.back(), y, 1e-5, 1e-5, "rmsnorm y");
  expect_close(grstd.back(), rstd, 1e-5, 1e-5, "rmsnorm rstd");

  auto dx = random_floats(rows * dim, 16), dw = random_floats(dim, 17);
  DeviceArray<float> gdy(dy), gdx(dx), gdw(dw), grstd_cpu(rstd);
  k::rmsnorm_backward(dy.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), rows, dim);
  ops_->rmsnorm_backward(gdy, gx, gw, grstd_cpu, gdx, gdw, rows, dim);
  expect_close(gdx.back(), dx, 1e-5, 1e-5, "rmsnorm dx");
  expect_close(gdw.back(), dw, 1e-5, 1e-5, "rmsnorm dw");
}

TEST_F(CudaOpsParity, LayerNormForwardAndBackward) {
  const int64_t rows = 17, dim = 260;
  const auto x = random_floats(rows * dim, 18), w = random_floats(dim, 19), b = random_floats(dim, 20);
  const auto dy = random_floats(rows * dim, 21);
  std::vector<float> y(rows * dim), mean(rows), rstd(rows);
  k::layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, dim, 1e-5f);
  DeviceArray<float> gx(x), gw(w), gb(b), gy(rows * dim), gmean(rows), grstd(rows);
  ops_->layernorm_forward(gx, gw, gb, gy, gmean, grstd, rows, dim, 1e-5f);
  expect_close(gy.back(), y, 1e-5, 1e-5, "layernorm y");
  expect_close(gmean.back(), mean, 1e-6, 1e-5, "layernorm mean");
  expect_close(grstd.back(), rstd, 1e-5, 1e-5, "layernorm rstd");

  auto dx = random_floats(rows * dim, 22), dw = random_floats(dim, 23), db = random_floats(dim, 24);
  DeviceArray<float> gdy(dy), gdx(dx), gdw(dw), gdb(db), cmean(mean), crstd(rstd);
  k::layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), rows,
                        dim);
  ops_->layernorm_backward(gdy, gx, gw, cmean, crstd, gdx, gdw, gdb, rows, dim);
  expect_close(gdx.back(), dx, 1e-5, 1e-5, "layernorm dx");
  expect_close(gdw.back(), dw, 1e-5, 1e-5, "layernorm dw");
  expect_close(gdb.back(), db, 1e-5, 1e-5, "layernorm db");
}

TEST_F(CudaOpsParity, RotaryEmbeddingBothDirections) {
  const int64_t batch = 2, seq = 11, heads = 3, head_dim = 16, rows = batch * seq;
  for (const int64_t rotary : {head_dim, int64_t{12}}) {  // full, and partial as Phi-4-mini's 0.75
    std::vector<float> cos(seq * rotary / 2), sin(seq * rotary / 2);
    model::rope_tables(seq, model::rope_inverse_frequencies(rotary, 10000.0, {}, seq), cos.data(), sin.data());
    for (bool backward : {false, true}) {
      auto x = random_floats(rows * heads * head_dim, 25);
      DeviceArray<float> gx(x), gcos(cos), gsin(sin);
      k::rope_apply(x.data(), cos.data(), sin.data(), rows, seq, heads, head_dim, rotary, backward);
      ops_->rope_apply(gx, gcos, gsin, rows, seq, heads, head_dim, rotary, backward);
      expect_close(gx.back(), x, 1e-6, 1e-6, backward ? "rope backward" : "rope forward");
    }
  }
}

TEST_F(CudaOpsParity, GeluAndSwiglu) {
  const size_t n = 5000;
  const auto x = random_floats(n, 26, -6, 6), u = random_floats(n, 27), dy = random_floats(n, 28);
  std::vector<float> y(n), dx(n), dg(n), du(n);
  DeviceArray<float> gx(x), gu(u), gdy(dy), gy(n), gdx(n), gdg(n), gdu(n);
  k::gelu_forward(x.data(), y.data(), n);
  ops_->gelu_forward(gx, gy, n);
  expect_close(gy.back(), y, 1e-6, 1e-5, "gelu y");
  k::gelu_backward(dy.data(), x.data(), dx.data(), n);
  ops_->gelu_backward(gdy, gx, gdx, n);
  expect_close(gdx.back(), dx, 1e-6, 1e-5, "gelu dx");
  k::swiglu_forward(x.data(), u.data(), y.data(), n);
  ops_->swiglu_forward(gx, gu, gy, n);
  expect_close(gy.back(), y, 1e-6, 1e-5, "swiglu y");
  k::swiglu_backward(dy.data(), x.data(), u.data(), dg.data(), du.data(), n);
  ops_->swiglu_backward(gdy, gx, gu, gdg, gdu, n);
  expect_close(gdg.back(), dg, 1e-6, 1e-5, "swiglu dg");
  expect_close(gdu.back(), du, 1e-6, 1e-5, "swiglu du");
  k::geglu_forward(x.data(), u.data(), y.data(), n);
  ops_->geglu_forward(gx, gu, gy, n);
  expect_close(gy.back(), y, 1e-6, 1e-5, "geglu y");
  k::geglu_backward(dy.data(), x.data(), u.data(), dg.data(), du.data(), n);
  ops_->geglu_backward(gdy, gx, gu, gdg, gdu, n);
  expect_close(gdg.back(), dg, 1e-6, 1e-5, "geglu dg");
  expect_close(gdu.back(), du, 1e-6, 1e-5, "geglu du");
  k::scale(y.data(), 1.5f, n);
  ops_->scale(gy, 1.5f, n);
  expect_close(gy.back(), y, 1e-6, 1e-6, "scale");
}

TEST_F(CudaOpsParity, EmbeddingIsExact) {
  const int64_t batch = 3, seq = 9, dim = 40, vocab = 7, rows = batch * seq;  // few tokens: many repeats
  const auto tokens = random_tokens(rows, vocab, 29);
  const auto table = random_floats(vocab * dim, 30), positions = random_floats(seq * dim, 31);
  const auto dy = random_floats(rows * dim, 32);
  std::vector<float> y(rows * dim);
  k::embedding_forward(tokens.data(), table.data(), positions.data(), y.data(), rows, seq, dim);
  DeviceArray<int32_t> gtokens(tokens);
  DeviceArray<float> gtable(table), gpositions(positions), gy(rows * dim), gdy(dy);
  ops_->embedding_forward(gtokens, gtable, gpositions, gy, rows, seq, dim);
  expect_close(gy.back(), y, 0, 0, "embedding y");
  auto dtable = random_floats(vocab * dim, 33), dpositions = random_floats(seq * dim, 34);
  DeviceArray<float> gdtable(dtable), gdpositions(dpositions);
  k::embedding_backward(tokens.data(), dy.data(), dtable.data(), dpositions.data(), rows, seq, dim);
  ops_->embedding_backward(gtokens, gdy, gdtable, gdpositions, rows, seq, dim);
  expect_close(gdtable.back(), dtable, 0, 0, "embedding dtable");
  expect_close(gdpositions.back(), dpositions, 0, 0, "embedding dpositions");
}

TEST_F(CudaOpsParity, CrossEntropyLossAndGradient) {
  const int64_t rows = 23, vocab = 1000;
  auto logits = random_floats(rows * vocab, 35, -8, 8);
  const auto targets = random_tokens(rows, static_cast<int32_t>(vocab), 36);
  DeviceArray<float> glogits(logits);
  DeviceArray<int32_t> gtargets(targets);
  const double want = k::cross_entropy(logits.data(), targets.data(), rows, vocab, 0.25f);
  const double got = ops_->cross_entropy(glogits, gtargets, rows, vocab, 0.25f);
  EXPECT_NEAR(got, want, 1e-4 * std::abs(want));
  expect_close(glogits.back(), logits, 1e-6, 1e-4, "dlogits");
}

TEST_F(CudaOpsParity, AddAndAccumulateAreExact) {
  const size_t n = 3001;
  const auto a = random_floats(n, 37), b = random_floats(n, 38);
  std::vector<float> y(n), acc = a;
  DeviceArray<float> ga(a), gb(b), gy(n), gacc(a);
  k::add(a.data(), b.data(), y.data(), n);
  ops_->add(ga, gb, gy, n);
  expect_close(gy.back(), y, 0, 0, "add");
  k::accumulate(acc.data(), b.data(), n);
  ops_->accumulate(gacc, gb, n);
  expect_close(gacc.back(), acc, 0, 0, "accumulate");
}

TEST_F(CudaOpsParity, AccumulateBf16IsExact) {
  const size_t n = 3001;
  const auto start = random_floats(n, 60, -4, 4), x = random_floats(n, 61, -0.05f, 0.05f);
  std::vector<uint16_t> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = float_to_bf16(start[i]);
  DeviceArray<uint16_t> gy(y);
  DeviceArray<float> gx(x);
  ops_->accumulate_bf16(gy, gx, n);
  const std::vector<uint16_t> got = gy.back();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], float_to_bf16(bf16_to_float(y[i]) + x[i])) << "element " << i;
  }
}

// Device memory `data` [n] copied home after the ops issued so far.
template <typename T>
std::vector<T> download(Ops& ops, const void* data, size_t n) {
  ops.synchronize();
  std::vector<T> host(n);
  EMU_CUDA_CHECK(cudaMemcpy(host.data(), data, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

TEST_F(CudaOpsParity, ScratchZeroFillAndHostCopies) {
  const size_t n = 12345;
  const std::vector<float> values = random_floats(n, 62);
  // Dirty a block first, so that a zero-filled allocation the pool hands back from it must really be zeroed.
  void* dirty = ops_->scratch_allocate(n * sizeof(float), false);
  ASSERT_NE(dirty, nullptr);
  ops_->copy_from_host(dirty, values.data(), n * sizeof(float));
  EXPECT_EQ(download<float>(*ops_, dirty, n), values) << "copy_from_host round trip";
  ops_->fill_zero(static_cast<float*>(dirty) + 100, 50 * sizeof(float));
  std::vector<float> partly = values;
  std::fill(partly.begin() + 100, partly.begin() + 150, 0.0f);
  EXPECT_EQ(download<float>(*ops_, dirty, n), partly) << "fill_zero over [100, 150)";
  ops_->scratch_free(dirty, n * sizeof(float));

  void* zeroed = ops_->scratch_allocate(n * sizeof(float), true);
  ASSERT_NE(zeroed, nullptr);
  EXPECT_EQ(download<float>(*ops_, zeroed, n), std::vector<float>(n, 0.0f)) << "scratch_allocate(zero = true)";
  ops_->scratch_free(zeroed, n * sizeof(float));

  void* empty = ops_->scratch_allocate(0, true);  // zero bytes: whatever it returns, scratch_free takes back
  ops_->scratch_free(empty, 0);
  ops_->synchronize();
}

// Attention shapes. q, k and v live in one host array, so both layouts share the test code: dense (Llama) as
// three arrays one after another, [T, a·d] then [T, kv·d] twice; fused (GPT-2) as the column blocks of one
// [T, 3·a·d] array, row strides 3·a·d. Their gradients are laid out the same way in another array.
struct AttentionCase {
  const char* name;
  int64_t batch, seq, heads, kv_heads, head_dim;
  bool fused;

  int64_t rows() const { return batch * seq; }
  AttentionShape shape() const {
    const int64_t stride = fused ? 3 * heads * head_dim : 0;
    return AttentionShape{batch, seq, heads, kv_heads, head_dim, stride, stride};
  }
  size_t elements() const { return size_t(rows() * (heads + 2 * kv_heads) * head_dim); }
  size_t k_offset() const { return size_t(fused ? heads * head_dim : rows() * heads * head_dim); }
  size_t v_offset() const { return size_t(fused ? 2 * heads * head_dim : rows() * (heads + kv_heads) * head_dim); }
  size_t out_elements() const { return size_t(rows() * heads * head_dim); }
  size_t lse_elements() const { return size_t(batch * heads * seq); }
  size_t probs_elements() const { return lse_elements() * size_t(seq); }
};

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

class CudaAttentionParity : public CudaOpsParity, public testing::WithParamInterface<AttentionCase> {};

constexpr double kAttentionAtol = 1e-5, kAttentionRtol = 1e-4;

// Classic: probs and out; then backward from the CPU's probs and out, so it is checked on its own. Every output
// starts as random values, so that an element the op fails to overwrite shows.
TEST_P(CudaAttentionParity, Classic) {
  const AttentionCase c = GetParam();
  const AttentionShape shape = c.shape();
  const auto qkv = random_floats(c.elements(), 70), dout = random_floats(c.out_elements(), 71);
  auto probs = random_floats(c.probs_elements(), 72), out = random_floats(c.out_elements(), 73);
  DeviceArray<float> gqkv(qkv), gdout(dout), gprobs(probs), gout(out);
  k::attention_forward_classic(shape, qkv.data(), qkv.data() + c.k_offset(), qkv.data() + c.v_offset(), probs.data(),
                               out.data());
  ops_->attention_forward_classic(shape, gqkv, gqkv + c.k_offset(), gqkv + c.v_offset(), gprobs, gout);
  expect_close(gprobs.back(), probs, kAttentionAtol, kAttentionRtol, "classic probs");
  expect_close(gout.back(), out, kAttentionAtol, kAttentionRtol, "classic out");

  auto dqkv = random_floats(c.elements(), 74), dscores = random_floats(c.probs_elements(), 75);
  DeviceArray<float> gprobs_cpu(probs), gout_cpu(out), gdqkv(dqkv), gdscores(dscores);
  k::attention_backward_classic(shape, qkv.data(), qkv.data() + c.k_offset(), qkv.data() + c.v_offset(), probs.data(),
                                out.data(), dout.data(), dqkv.data(), dqkv.data() + c.k_offset(),
                                dqkv.data() + c.v_offset(), dscores.data());
  ops_->attention_backward_classic(shape, gqkv, gqkv + c.k_offset(), gqkv + c.v_offset(), gprobs_cpu, gout_cpu, gdout,
                                   gdqkv, gdqkv + c.k_offset(), gdqkv + c.v_offset(), gdscores);
  expect_close(gdscores.back(), dscores, kAttentionAtol, kAttentionRtol, "classic dscores");
  expect_close(gdqkv.back(), dqkv, kAttentionAtol, kAttentionRtol, "classic dq, dk, dv");
}

// Flash-style: out and lse; then backward from the CPU's out and lse.
TEST_P(CudaAttentionParity, Flash) {
  const AttentionCase c = GetParam();
  const AttentionShape shape = c.shape();
  const auto qkv = random_floats(c.elements(), 80), dout = random_floats(c.out_elements(), 81);
  auto out = random_floats(c.out_elements(), 82), lse = random_floats(c.lse_elements(), 83);
  DeviceArray<float> gqkv(qkv), gdout(dout), gout(out), glse(lse);
  k::attention_forward_flash(shape, qkv.data(), qkv.data() + c.k_offset(), qkv.data() + c.v_offset(), out.data(),
                             lse.data());
  ops_->attention_forward_flash(shape, gqkv, gqkv + c.k_offset(), gqkv + c.v_offset(), gout, glse);
  expect_close(gout.back(), out, kAttentionAtol, kAttentionRtol, "flash out");
  expect_close(glse.back(), lse, kAttentionAtol, kAttentionRtol, "flash lse");

  auto dqkv = random_floats(c.elements(), 84);
  DeviceArray<float> gout_cpu(out), glse_cpu(lse), gdqkv(dqkv);
  k::attention_backward_flash(shape, qkv.data(), qkv.data() + c.k_offset(), qkv.data() + c.v_offset(), out.data(),
                              lse.data(), dout.data(), dqkv.data(), dqkv.data() + c.k_offset(),
                              dqkv.data() + c.v_offset());
  ops_->attention_backward_flash(shape, gqkv, gqkv + c.k_offset(), gqkv + c.v_offset(), gout_cpu, glse_cpu, gdout,
                                 gdqkv, gdqkv + c.k_offset(), gdqkv + c.v_offset());
  expect_close(gdqkv.back(), dqkv, kAttentionAtol, kAttentionRtol, "flash dq, dk, dv");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionParity,
                         testing::Values(AttentionCase{"llama_gqa", 2, 17, 4, 2, 8, false},
                                         AttentionCase{"gpt2_fused_qkv", 2, 13, 3, 3, 8, true}),
                         [](const testing::TestParamInfo<AttentionCase>& param) { return param.param.name; });

// The CPU update (optim::adamw_update) against the op, with the step constants computed as adamw_update does.
struct AdamWCase {
  DType weights, moments, grads;
  bool decay;
  bool copy;
};

class CudaAdamWParity : public CudaOpsParity, public testing::WithParamInterface<AdamWCase> {};

template <typename T>
std::vector<T> stored(const std::vector<float>& values, DType dtype);
template <>
std::vector<float> stored(const std::vector<float>& values, DType) {
  return values;
}
template <>
std::vector<uint16_t> stored(const std::vector<float>& values, DType) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]);
  return bits;
}

// Host bytes of `values` in `dtype`.
std::vector<uint8_t> as_bytes(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * dtype_size(dtype));
  if (dtype == DType::kF32) {
    std::memcpy(bytes.data(), values.data(), bytes.size());
  } else {
    const auto bits = stored<uint16_t>(values, dtype);
    std::memcpy(bytes.data(), bits.data(), bytes.size());
  }
  return bytes;
}

std::vector<float> as_floats(const std::vector<uint8_t>& bytes, DType dtype) {
  std::vector<float> values(bytes.size() / dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&values[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes.data() + 2 * i, 2);
      values[i] = bf16_to_float(bits);
    }
  }
  return values;
}

TEST_P(CudaAdamWParity, MatchesTheCpuUpdate) {
  const AdamWCase c = GetParam();
  const size_t n = 2049;
  auto w = as_bytes(random_floats(n, 40), c.weights), g = as_bytes(random_floats(n, 41), c.grads);
  auto m = as_bytes(random_floats(n, 42, -0.1f, 0.1f), c.moments),
       v = as_bytes(random_floats(n, 43, 0, 0.01f), c.moments);
  std::vector<uint16_t> copy(c.copy ? n : 0);
  DeviceArray<uint8_t> gw(w), gm(m), gv(v), gg(g);
  DeviceArray<uint16_t> gcopy(copy);

  optim::AdamWConfig config;
  config.lr = 3e-3;
  config.weight_decay = 0.1;
  const int64_t t = 7;
  const float grad_scale = 0.5f;
  const std::vector<optim::DecayRange> decay =
      c.decay ? std::vector<optim::DecayRange>{{0, n}} : std::vector<optim::DecayRange>{};
  optim::AdamWStep step;
  step.weights = optim::ElementSpan(w.data(), n, c.weights);
  step.m = optim::ElementSpan(m.data(), n, c.moments);
  step.v = optim::ElementSpan(v.data(), n, c.moments);
  step.grads = optim::ConstElementSpan(g.data(), n, c.grads);
  if (c.copy) step.compute_copy = optim::ElementSpan(copy.data(), n, DType::kBF16);
  step.decay = decay;
  step.step = t;
  step.lr = config.lr;
  step.grad_scale = grad_scale;
  optim::adamw_update(config, step);

  AdamWOp op;
  op.weights = gw.get();
  op.weights_dtype = c.weights;
  op.m = gm.get();
  op.v = gv.get();
  op.moments_dtype = c.moments;
  op.grads = gg.get();
  op.grads_dtype = c.grads;
  op.copy = c.copy ? gcopy.get() : nullptr;
  op.n = n;
  op.decay = c.decay;
  op.beta1 = float(config.beta1);
  op.beta2 = float(config.beta2);
  op.eps = float(config.eps);
  op.one_minus_beta1 = float(1.0 - config.beta1);
  op.one_minus_beta2 = float(1.0 - config.beta2);
  op.step_size = float(config.lr / (1.0 - std::pow(config.beta1, double(t))));
  op.bias_correction2_sqrt = float(std::sqrt(1.0 - std::pow(config.beta2, double(t))));
  op.decay_factor = float(1.0 - config.lr * config.weight_decay);
  op.grad_scale = grad_scale;
  ops_->adamw(op);

  const double wtol = c.weights == DType::kF32 ? 1e-6 : 1.0 / 128;
  const double mtol = c.moments == DType::kF32 ? 1e-6 : 1.0 / 128;
  expect_close(as_floats(gw.back(), c.weights), as_floats(w, c.weights), 1e-6, wtol, "weights");
  expect_close(as_floats(gm.back(), c.moments), as_floats(m, c.moments), 1e-6, mtol, "m");
  expect_close(as_floats(gv.back(), c.moments), as_floats(v, c.moments), 1e-9, mtol, "v");
  if (c.copy) {
    std::vector<float> want(n), got(n);
    const auto bits = gcopy.back();
    for (size_t i = 0; i < n; ++i) {
      want[i] = bf16_to_float(copy[i]);
      got[i] = bf16_to_float(bits[i]);
    }
    expect_close(got, want, 1e-6, 1.0 / 128, "bf16 compute copy");
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, CudaAdamWParity,
                         testing::Values(AdamWCase{DType::kF32, DType::kF32, DType::kBF16, true, true},   // mixed
                                         AdamWCase{DType::kF32, DType::kF32, DType::kF32, false, false},  // fp32
                                         AdamWCase{DType::kBF16, DType::kBF16, DType::kBF16, true, false}));

}  // namespace
}  // namespace emu
