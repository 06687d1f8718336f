#include "emu/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "emu/bf16.h"
#include "emu/cpu/adamw.h"
#include "emu/cpu/attention_kernels.h"
#include "emu/cpu/kernels.h"

namespace emu::cpu {
namespace {

class CpuOps final : public Ops {
 public:
  std::string_view backend() const override { return "cpu"; }
  void synchronize() override {}

  void bf16_to_f32(const uint16_t* x, float* y, size_t n) override { widen_bf16(x, y, n); }
  void f32_to_bf16(const float* x, uint16_t* y, size_t n) override { narrow_bf16(x, y, n); }

  void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in,
                      int64_t out, WeightLayout layout) override {
    cpu::linear_forward(x, w, bias, y, rows, in, out, layout);
  }
  void linear_forward_bf16(const uint16_t* x, const uint16_t* w, const float* bias, float* y, int64_t rows, int64_t in,
                           int64_t out, WeightLayout layout) override {
    // The host has no bf16 matrix product: fp32 copies in scratch kept from call to call (not zeroed first; the
    // widening writes every element).
    float* xf = widened_x_.reserve_as<float>(*this, size_t(rows * in), false);
    float* wf = widened_w_.reserve_as<float>(*this, size_t(in * out), false);
    widen_bf16(x, xf, size_t(rows * in));
    widen_bf16(w, wf, size_t(in * out));
    cpu::linear_forward(xf, wf, bias, y, rows, in, out, layout);
  }
  void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* dbias,
                       int64_t rows, int64_t in, int64_t out, WeightLayout layout, bool accumulate_dx) override {
    cpu::linear_backward(x, w, dy, dx, dw, dbias, rows, in, out, layout, accumulate_dx);
  }

  void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim,
                       float eps) override {
    cpu::rmsnorm_forward(x, w, y, rstd, rows, dim, eps);
  }
  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                        int64_t rows, int64_t dim) override {
    cpu::rmsnorm_backward(dy, x, w, rstd, dx, dw, rows, dim);
  }
  void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                         int64_t rows, int64_t dim, float eps) override {
    cpu::layernorm_forward(x, w, b, y, mean, rstd, rows, dim, eps);
  }
  void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                          float* dx, float* dw, float* db, int64_t rows, int64_t dim) override {
    cpu::layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, rows, dim);
  }

  void rope_apply(float* x, const float* cos, const float* sin, int64_t rows, int64_t seq, int64_t heads,
                  int64_t head_dim, int64_t rotary_dim, bool backward) override {
    cpu::rope_apply(x, cos, sin, rows, seq, heads, head_dim, rotary_dim, backward);
  }

  void gelu_forward(const float* x, float* y, size_t n) override { cpu::gelu_forward(x, y, n); }
  void gelu_backward(const float* dy, const float* x, float* dx, size_t n) override {
    cpu::gelu_backward(dy, x, dx, n);
  }
  void swiglu_forward(const float* g, const float* u, float* y, size_t n) override { cpu::swiglu_forward(g, u, y, n); }
  void swiglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) override {
    cpu::swiglu_backward(dy, g, u, dg, du, n);
  }
  void geglu_forward(const float* g, const float* u, float* y, size_t n) override { cpu::geglu_forward(g, u, y, n); }
  void geglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) override {
    cpu::geglu_backward(dy, g, u, dg, du, n);
  }
  void scale(float* y, float alpha, size_t n) override { cpu::scale(y, alpha, n); }
  void softcap_forward(float* y, float* t, float cap, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      t[i] = std::tanh(y[i] / cap);
      y[i] = cap * t[i];
    }
  }
  void softcap_backward(float* dy, const float* t, size_t n) override {
    for (size_t i = 0; i < n; ++i) dy[i] *= 1.0f - t[i] * t[i];
  }

  void embedding_forward(const int32_t* tokens, const float* table, const float* positions, float* y, int64_t rows,
                         int64_t seq, int64_t dim) override {
    cpu::embedding_forward(tokens, table, positions, y, rows, seq, dim);
  }
  void embedding_backward(const int32_t* tokens, const float* dy, float* dtable, float* dpositions, int64_t rows,
                          int64_t seq, int64_t dim) override {
    cpu::embedding_backward(tokens, dy, dtable, dpositions, rows, seq, dim);
  }

  double cross_entropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab, float grad_scale) override {
    return cpu::cross_entropy(logits, targets, rows, vocab, grad_scale);
  }

  void attention_forward_classic(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                 float* probs, float* out) override {
    cpu::attention_forward_classic(shape, q, k, v, probs, out);
  }
  void attention_backward_classic(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                  const float* probs, const float* out, const float* dout, float* dq, float* dk,
                                  float* dv, float* dscores) override {
    cpu::attention_backward_classic(shape, q, k, v, probs, out, dout, dq, dk, dv, dscores);
  }
  void attention_forward_flash(const AttentionShape& shape, const float* q, const float* k, const float* v, float* out,
                               float* lse) override {
    cpu::attention_forward_flash(shape, q, k, v, out, lse);
  }
  void attention_backward_flash(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                const float* out, const float* lse, const float* dout, float* dq, float* dk,
                                float* dv) override {
    cpu::attention_backward_flash(shape, q, k, v, out, lse, dout, dq, dk, dv);
  }

  void add(const float* a, const float* b, float* y, size_t n) override { cpu::add(a, b, y, n); }
  void accumulate(float* y, const float* x, size_t n) override { cpu::accumulate(y, x, n); }
  void accumulate_bf16(uint16_t* y, const float* x, size_t n) override { emu::accumulate_bf16(y, x, n); }

  void adamw(const AdamWOp& op) override { cpu::adamw(op); }

  // Aligned as the cpu device's buffers are (64 bytes): the kernels' vectorised sums then run in the same order
  // whatever the address, so results repeat bit for bit from run to run.
  void* scratch_allocate(size_t bytes, bool zero) override {
    constexpr size_t kAlignment = 64;
    const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    void* data = std::aligned_alloc(kAlignment, rounded);
    if (data == nullptr) throw std::bad_alloc();
    if (zero) std::memset(data, 0, bytes);
    return data;
  }
  void scratch_free(void* data, size_t) override { std::free(data); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, bytes);
  }

 private:
  Scratch widened_x_, widened_w_;  // linear_forward_bf16's fp32 copies
};

}  // namespace

Ops& cpu_ops() {
  static CpuOps ops;
  return ops;
}

}  // namespace emu::cpu
