// The ops the transformer needs, behind one interface each device backend provides (DESIGN.md §6).
//
// The model (workloads/model) computes only through these: on the cpu device they are the CPU kernels
// (emu/cpu/cpu_ops.h: OpenBLAS, Eigen, fp32), on a CUDA device its kernels and cuBLAS (emu/cuda/cuda_ops.cu).
// Model and strategy code never name a backend; they ask the device for its ops (Device::ops(), null on a
// shapes-only device, which computes nothing).
//
// Shapes and semantics are those of emu/cpu/kernels.h and attention_kernels.h, row-major, T = b·s rows; every
// pointer is memory of the providing backend (a device buffer, or scratch from scratch()). Backward ops accumulate
// (+=) into weight and bias gradients and overwrite input gradients unless they say otherwise. Ops may run
// asynchronously on the backend's stream, in order; synchronize() waits for all of them, and must be called before
// host code reads or writes what an op touched (the model does so before each hook returns control to a strategy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "emu/device.h"

namespace emu {

// Weight layouts of a linear layer.
enum class WeightLayout : uint8_t {
  kOutIn,  // torch.nn.Linear: W [out, in], y = x · Wᵀ
  kInOut,  // GPT-2's Conv1D:  W [in, out], y = x · W
};

// Causal multi-head / grouped-query attention (emu/cpu/attention_kernels.h): q [T, a·d], k and v [T, kv·d], out
// [T, a·d], head h reading key/value head h / (a/kv). q, k, v and their gradients may be column blocks of a wider
// tensor (GPT-2's fused [T, 3h] qkv): their row strides are q_stride and kv_stride.
struct AttentionShape {
  int64_t batch = 0;
  int64_t seq = 0;
  int64_t heads = 0;      // a
  int64_t kv_heads = 0;   // kv
  int64_t head_dim = 0;   // d
  int64_t q_stride = 0;   // row stride of q and dq; 0: a·d
  int64_t kv_stride = 0;  // row stride of k, v, dk and dv; 0: kv·d
  float scale = 0;        // the scores' factor; 0: 1/√d (Gemma 2: query_pre_attn_scalar^−½)
  float softcap = 0;      // scores soft-capped to cap·tanh(scores/cap) before the mask (Gemma 2); 0: none
};

// One AdamW update over n elements: weights fp32 (mixed recipe's master copy) or bf16; m, v fp32 or bf16 (both
// the same); grads fp32 or bf16; copy (optional, bf16) receives the updated weights rounded. `decay` says
// whether weight decay applies to all n elements (callers split a span at its decay ranges, as optim/adamw.cpp).
// The step constants are computed by the caller exactly as optim::adamw_update does.
struct AdamWOp {
  void* weights = nullptr;
  DType weights_dtype = DType::kF32;
  void* m = nullptr;
  void* v = nullptr;
  DType moments_dtype = DType::kF32;
  const void* grads = nullptr;
  DType grads_dtype = DType::kF32;
  uint16_t* copy = nullptr;
  size_t n = 0;
  bool decay = false;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float one_minus_beta1 = 0.1f, one_minus_beta2 = 0.001f;
  float step_size = 0;              // lr / (1 − β1^t)
  float bias_correction2_sqrt = 1;  // sqrt(1 − β2^t)
  float decay_factor = 1;           // 1 − lr · weight_decay (AdamW); 1 under L2 decay
  float l2 = 0;                     // Adam's L2 decay: weight_decay, the gradient plus l2 · w where `decay`
  float grad_scale = 1;
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string_view backend() const = 0;
  // Waits for every op issued so far.
  virtual void synchronize() = 0;

  // Casts: bf16 (uint16 bit patterns, rounded to nearest even on store) to and from fp32.
  virtual void bf16_to_f32(const uint16_t* x, float* y, size_t n) = 0;
  virtual void f32_to_bf16(const float* x, uint16_t* y, size_t n) = 0;

  // y [T, out] = x [T, in] · W (+ bias [out]); fp32 in, fp32 accumulation, fp32 out (the CPU path's sgemm).
  virtual void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in,
                              int64_t out, WeightLayout layout) = 0;
  // The same with bf16 x and W (what a GPU keeps), fp32 accumulation and fp32 y.
  virtual void linear_forward_bf16(const uint16_t* x, const uint16_t* w, const float* bias, float* y, int64_t rows,
                                   int64_t in, int64_t out, WeightLayout layout) = 0;
  // dW += xᵀ·dy, dbias += Σ_rows dy (when not null), dx = dy·Wᵀ (+= when accumulate_dx; none when null).
  virtual void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* dbias,
                               int64_t rows, int64_t in, int64_t out, WeightLayout layout, bool accumulate_dx) = 0;

  // RMSNorm y = x / sqrt(mean(x²) + eps) · w, rstd [T] kept; backward dx += ..., dw += ...
  virtual void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim,
                               float eps) = 0;
  virtual void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                                float* dw, int64_t rows, int64_t dim) = 0;
  // LayerNorm y = (x − mean) · rstd · w + b, mean and rstd [T] kept; backward dx += ..., dw += ..., db += ...
  virtual void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                 int64_t rows, int64_t dim, float eps) = 0;
  virtual void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                                  float* dx, float* dw, float* db, int64_t rows, int64_t dim) = 0;

  // Rotary embedding in place on x [T, heads·d], rotate_half convention over the first rotary_dim dimensions of each
  // head (d for a full rotary embedding; Phi-4-mini's partial one turns 96 of 128, the rest pass through), cos/sin
  // [seq, rotary_dim/2]; backward rotates back.
  virtual void rope_apply(float* x, const float* cos, const float* sin, int64_t rows, int64_t seq, int64_t heads,
                          int64_t head_dim, int64_t rotary_dim, bool backward) = 0;

  // GELU (tanh approximation), SwiGLU y = silu(g)·u and GeGLU y = gelu_tanh(g)·u (Gemma), element-wise over n.
  virtual void gelu_forward(const float* x, float* y, size_t n) = 0;
  virtual void gelu_backward(const float* dy, const float* x, float* dx, size_t n) = 0;
  virtual void swiglu_forward(const float* g, const float* u, float* y, size_t n) = 0;
  virtual void swiglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) = 0;
  virtual void geglu_forward(const float* g, const float* u, float* y, size_t n) = 0;
  virtual void geglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) = 0;
  // y *= alpha over n (Gemma's embedding scale, forward and backward).
  virtual void scale(float* y, float alpha, size_t n) = 0;
  // Soft-capping (Gemma 2's final logits): t = tanh(y / cap), y = cap·t over n; backward dy *= 1 − t².
  virtual void softcap_forward(float* y, float* t, float cap, size_t n) = 0;
  virtual void softcap_backward(float* dy, const float* t, size_t n) = 0;

  // y [T, dim] = table[tokens[t]] (+ positions[t mod seq]); backward dtable[tokens[t]] += dy[t] (dpositions too).
  virtual void embedding_forward(const int32_t* tokens, const float* table, const float* positions, float* y,
                                 int64_t rows, int64_t seq, int64_t dim) = 0;
  virtual void embedding_backward(const int32_t* tokens, const float* dy, float* dtable, float* dpositions,
                                  int64_t rows, int64_t seq, int64_t dim) = 0;

  // Σ_t (logsumexp − logit[target]) returned (synchronises), logits turned in place into (softmax − onehot)·scale.
  virtual double cross_entropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                               float grad_scale) = 0;

  // Attention, classic: probs [b, a, s, s] receives the causal softmax of q·kᵀ/√d (zeros above the diagonal);
  // backward overwrites dq, dk, dv and uses dscores [b, a, s, s] as its work area.
  virtual void attention_forward_classic(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                         float* probs, float* out) = 0;
  virtual void attention_backward_classic(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                          const float* probs, const float* out, const float* dout, float* dq, float* dk,
                                          float* dv, float* dscores) = 0;
  // Attention, flash-style: keeps lse [b, a, s], the logsumexp of each scaled, masked score row, and recomputes
  // the probabilities from it in backward; backward overwrites dq, dk, dv.
  virtual void attention_forward_flash(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                       float* out, float* lse) = 0;
  virtual void attention_backward_flash(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                        const float* out, const float* lse, const float* dout, float* dq, float* dk,
                                        float* dv) = 0;

  // y = a + b; y += x
  virtual void add(const float* a, const float* b, float* y, size_t n) = 0;
  virtual void accumulate(float* y, const float* x, size_t n) = 0;
  // y = bf16(float(y) + x): a gradient accumulated into a bf16 buffer, rounded to nearest even once per call.
  virtual void accumulate_bf16(uint16_t* y, const float* x, size_t n) = 0;

  virtual void adamw(const AdamWOp& op) = 0;

  // Memory the ops work in that no emulated GPU would hold (fp32 working copies, host-side inputs brought over):
  // not charged to the device's cap. Backend memory; zero-filled when `zero`.
  virtual void* scratch_allocate(size_t bytes, bool zero) = 0;
  virtual void scratch_free(void* data, size_t bytes) = 0;
  // Host → backend memory, and zero-filling backend memory; ordered with the ops.
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
};

// Backend scratch of a growing size (Ops::scratch_allocate), released when destroyed. Move-only.
class Scratch {
 public:
  Scratch() = default;
  ~Scratch() { release(); }
  Scratch(Scratch&& other) noexcept { swap(other); }
  Scratch& operator=(Scratch&& other) noexcept {
    if (this != &other) {
      release();
      swap(other);
    }
    return *this;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // At least `bytes` of ops' scratch (reused when big enough), zero-filled over those bytes when `zero`.
  void* reserve(Ops& ops, size_t bytes, bool zero) {
    if (ops_ != &ops || bytes > bytes_) {
      release();
      data_ = ops.scratch_allocate(bytes, zero);
      ops_ = &ops;
      bytes_ = bytes;
    } else if (zero && bytes > 0) {
      ops.fill_zero(data_, bytes);
    }
    return data_;
  }
  template <typename T>
  T* reserve_as(Ops& ops, size_t count, bool zero) {
    return static_cast<T*>(reserve(ops, count * sizeof(T), zero));
  }
  void release() {
    if (ops_ != nullptr && data_ != nullptr) ops_->scratch_free(data_, bytes_);
    ops_ = nullptr;
    data_ = nullptr;
    bytes_ = 0;
  }

 private:
  void swap(Scratch& other) noexcept {
    std::swap(ops_, other.ops_);
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
  }
  Ops* ops_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace emu
