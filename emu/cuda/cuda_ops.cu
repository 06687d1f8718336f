// The CUDA Ops (emu/ops.h): cuBLAS for matrix products, CUDA kernels for the rest, all on the legacy default
// stream of the rank's GPU, so they are ordered with each other and with cudaMemset/cudaFree. The attention kernels
// are in attention.cu, what the kernels share in launch.cuh, the bf16 conversion in bf16.cuh.
//
// Numerics follow the CPU kernels (emu/cpu/kernels.cpp) so the parity tests can hold tight tolerances: fp32
// everywhere, fp32 accumulation in cuBLAS (CUBLAS_COMPUTE_32F, never TF32), the row sums the CPU takes in double
// taken in double here, and the bf16 rounding done bit for bit as emu/bf16.h does it. Gradient sums over rows
// (weights, biases, embedding tables) run one thread per column in row order: deterministic, no atomics.
// Scratch (scratch_allocate) is stream-ordered: cudaMallocAsync/cudaFreeAsync on the same default stream.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "emu/cuda/attention.cuh"
#include "emu/cuda/bf16.cuh"
#include "emu/cuda/check.h"
#include "emu/cuda/cuda_device.h"
#include "emu/cuda/launch.cuh"

namespace emu::cuda {
namespace {

// Element access for the two storage types: fp32 as is, bf16 widened on load and rounded on store.
__device__ inline float load(const float* p, size_t i) { return p[i]; }
__device__ inline float load(const uint16_t* p, size_t i) { return bf16_load(p[i]); }
__device__ inline void store(float* p, size_t i, float v) { p[i] = v; }
__device__ inline void store(uint16_t* p, size_t i, float v) { p[i] = bf16_store(v); }

// ---- casts, element-wise ----

__global__ void k_bf16_to_f32(const uint16_t* x, float* y, size_t n) { EMU_FOR_EACH(i, n) y[i] = bf16_load(x[i]); }
__global__ void k_f32_to_bf16(const float* x, uint16_t* y, size_t n) { EMU_FOR_EACH(i, n) y[i] = bf16_store(x[i]); }
__global__ void k_add(const float* a, const float* b, float* y, size_t n) { EMU_FOR_EACH(i, n) y[i] = a[i] + b[i]; }
__global__ void k_accumulate(float* y, const float* x, size_t n) { EMU_FOR_EACH(i, n) y[i] += x[i]; }
__global__ void k_accumulate_bf16(uint16_t* y, const float* x, size_t n) {
  EMU_FOR_EACH(i, n) y[i] = bf16_store(bf16_load(y[i]) + x[i]);
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__global__ void k_gelu_forward(const float* x, float* y, size_t n) {
  EMU_FOR_EACH(i, n) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
  }
}
__global__ void k_gelu_backward(const float* dy, const float* x, float* dx, size_t n) {
  EMU_FOR_EACH(i, n) {
    const float v = x[i];
    const float t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}
__global__ void k_geglu_forward(const float* g, const float* u, float* y, size_t n) {
  EMU_FOR_EACH(i, n) {
    const float v = g[i];
    y[i] = 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v))) * u[i];
  }
}
__global__ void k_geglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) {
  EMU_FOR_EACH(i, n) {
    const float v = g[i];
    const float t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const float slope = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    dg[i] = dy[i] * u[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * slope);
    du[i] = dy[i] * 0.5f * v * (1.0f + t);
  }
}
__global__ void k_scale(float* y, float alpha, size_t n) { EMU_FOR_EACH(i, n) y[i] *= alpha; }
__global__ void k_softcap_forward(float* y, float* t, float cap, size_t n) {
  EMU_FOR_EACH(i, n) {
    t[i] = tanhf(y[i] / cap);
    y[i] = cap * t[i];
  }
}
__global__ void k_softcap_backward(float* dy, const float* t, size_t n) {
  EMU_FOR_EACH(i, n) dy[i] *= 1.0f - t[i] * t[i];
}
__global__ void k_swiglu_forward(const float* g, const float* u, float* y, size_t n) {
  EMU_FOR_EACH(i, n) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
__global__ void k_swiglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) {
  EMU_FOR_EACH(i, n) {
    const float sig = 1.0f / (1.0f + expf(-g[i]));
    dg[i] = dy[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
    du[i] = dy[i] * g[i] * sig;
  }
}

// ---- linear helpers ----

__global__ void k_fill_rows(const float* bias, float* y, int64_t rows, int64_t cols) {
  EMU_FOR_EACH(i, size_t(rows * cols)) y[i] = bias[i % size_t(cols)];
}
// acc[j] += Σ_r m[r, j], rows in order.
__global__ void k_column_sums(const float* m, float* acc, int64_t rows, int64_t cols) {
  EMU_FOR_EACH(j, size_t(cols)) {
    float sum = acc[j];
    for (int64_t r = 0; r < rows; ++r) sum += m[r * cols + j];
    acc[j] = sum;
  }
}

// ---- norms: one block per row ----

__global__ void k_rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t dim, float eps) {
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  double sum = 0;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) sum += double(xr[j]) * xr[j];
  sum = block_sum(sum);
  const float s = static_cast<float>(1.0 / sqrt(sum / double(dim) + eps));
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = xr[j] * s * w[j];
}
__global__ void k_rmsnorm_backward_dx(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                                      int64_t dim) {
  const int64_t at = blockIdx.x * dim;
  const float s = rstd[blockIdx.x];
  double dot = 0;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dot += double(dy[at + j]) * w[j] * x[at + j];
  dot = block_sum(dot);
  const float c = static_cast<float>(dot / double(dim)) * s * s * s;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dx[at + j] += s * dy[at + j] * w[j] - c * x[at + j];
}
__global__ void k_rmsnorm_backward_dw(const float* dy, const float* x, const float* rstd, float* dw, int64_t rows,
                                      int64_t dim) {
  EMU_FOR_EACH(j, size_t(dim)) {
    float sum = dw[j];
    for (int64_t r = 0; r < rows; ++r) sum += dy[r * dim + j] * x[r * dim + j] * rstd[r];
    dw[j] = sum;
  }
}
__global__ void k_layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                                    int64_t dim, float eps) {
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  double sum = 0;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) sum += xr[j];
  const double mu = block_sum(sum) / double(dim);
  double var = 0;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) var += (xr[j] - mu) * (xr[j] - mu);
  var = block_sum(var);
  const float s = static_cast<float>(1.0 / sqrt(var / double(dim) + eps));
  const float m = static_cast<float>(mu);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = s;
  }
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = (xr[j] - m) * s * w[j] + b[j];
}
__global__ void k_layernorm_backward_dx(const float* dy, const float* x, const float* w, const float* mean,
                                        const float* rstd, float* dx, int64_t dim) {
  const int64_t at = blockIdx.x * dim;
  const float m = mean[blockIdx.x], s = rstd[blockIdx.x];
  double sum_g = 0, sum_gx = 0;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const float xhat = (x[at + j] - m) * s;
    const float g = dy[at + j] * w[j];
    sum_g += g;
    sum_gx += double(g) * xhat;
  }
  sum_g = block_sum(sum_g);
  sum_gx = block_sum(sum_gx);
  const float mg = static_cast<float>(sum_g / double(dim)), mgx = static_cast<float>(sum_gx / double(dim));
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const float xhat = (x[at + j] - m) * s;
    dx[at + j] += s * (dy[at + j] * w[j] - mg - xhat * mgx);
  }
}
__global__ void k_layernorm_backward_dwdb(const float* dy, const float* x, const float* mean, const float* rstd,
                                          float* dw, float* db, int64_t rows, int64_t dim) {
  EMU_FOR_EACH(j, size_t(dim)) {
    float sw = dw[j], sb = db[j];
    for (int64_t r = 0; r < rows; ++r) {
      const float g = dy[r * dim + j];
      sw += g * ((x[r * dim + j] - mean[r]) * rstd[r]);
      sb += g;
    }
    dw[j] = sw;
    db[j] = sb;
  }
}

// ---- rotary embedding: one thread per (row, head, j < rotary_dim/2); dimensions past rotary_dim pass through ----

__global__ void k_rope(float* x, const float* cos, const float* sin, int64_t rows, int64_t seq, int64_t heads,
                       int64_t head_dim, int64_t rotary_dim, float sign) {
  const int64_t half = rotary_dim / 2;
  EMU_FOR_EACH(i, size_t(rows * heads * half)) {
    const int64_t j = int64_t(i) % half;
    const int64_t rh = int64_t(i) / half;  // row * heads + head
    const int64_t pos = (rh / heads) % seq;
    float* v = x + rh * head_dim;
    const float a = v[j], b = v[j + half], c = cos[pos * half + j], s = sign * sin[pos * half + j];
    v[j] = a * c - b * s;
    v[j + half] = b * c + a * s;
  }
}

// ---- embedding ----

__global__ void k_embedding_forward(const int32_t* tokens, const float* table, const float* positions, float* y,
                                    int64_t rows, int64_t seq, int64_t dim) {
  EMU_FOR_EACH(i, size_t(rows * dim)) {
    const int64_t r = int64_t(i) / dim, j = int64_t(i) % dim;
    const float value = table[int64_t(tokens[r]) * dim + j];
    y[i] = positions == nullptr ? value : value + positions[(r % seq) * dim + j];
  }
}
// One thread per column, rows in order: repeated tokens add up in the CPU's order, without atomics.
__global__ void k_embedding_backward(const int32_t* tokens, const float* dy, float* dtable, float* dpositions,
                                     int64_t rows, int64_t seq, int64_t dim) {
  EMU_FOR_EACH(j, size_t(dim)) {
    for (int64_t r = 0; r < rows; ++r) {
      dtable[int64_t(tokens[r]) * dim + j] += dy[r * dim + j];
      if (dpositions != nullptr) dpositions[(r % seq) * dim + j] += dy[r * dim + j];
    }
  }
}

// ---- cross-entropy: one block per row; loss[row] in double, bad[0] set on a target outside the vocabulary ----

__global__ void k_cross_entropy(float* logits, const int32_t* targets, double* loss, int* bad, int64_t vocab,
                                float grad_scale) {
  float* l = logits + blockIdx.x * vocab;
  const int32_t target = targets[blockIdx.x];
  if (target < 0 || target >= vocab) {
    if (threadIdx.x == 0) {
      atomicExch(bad, 1);
      loss[blockIdx.x] = 0;
    }
    return;
  }
  float max = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) max = fmaxf(max, l[j]);
  max = block_max(max);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(l[j] - max);
  sum = block_sum(sum);
  const float lse = max + logf(sum);
  if (threadIdx.x == 0) loss[blockIdx.x] = double(lse) - double(l[target]);
  __syncthreads();  // l[target] read before it is overwritten
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    l[j] = expf(l[j] - lse) * grad_scale - (j == target ? grad_scale : 0.0f);
  }
}

// ---- AdamW, as the CPU's (emu/cpu/adamw.cpp) ----

template <typename W, typename M, typename G>
__global__ void k_adamw(W* w, M* m, M* v, const G* g, uint16_t* copy, size_t n, bool decayed, AdamWOp k) {
  EMU_FOR_EACH(i, n) {
    float grad = load(g, i) * k.grad_scale;
    float weight = load(w, i);
    if (decayed) {
      grad += k.l2 * weight;  // Adam's L2 decay (0 under AdamW)
      weight *= k.decay_factor;
    }
    const float m_new = k.beta1 * load(m, i) + k.one_minus_beta1 * grad;
    const float v_new = k.beta2 * load(v, i) + k.one_minus_beta2 * grad * grad;
    const float denom = sqrtf(v_new) / k.bias_correction2_sqrt + k.eps;
    weight -= k.step_size * m_new / denom;
    store(m, i, m_new);
    store(v, i, v_new);
    store(w, i, weight);
    if (copy != nullptr) copy[i] = bf16_store(weight);
  }
}

template <typename W, typename M, typename G>
void launch_adamw(const AdamWOp& op) {
  k_adamw<W, M, G><<<blocks_for(op.n), kThreads>>>(static_cast<W*>(op.weights), static_cast<M*>(op.m),
                                                   static_cast<M*>(op.v), static_cast<const G*>(op.grads), op.copy,
                                                   op.n, op.decay, op);
}
template <typename W, typename M>
void adamw_grads(const AdamWOp& op) {
  op.grads_dtype == DType::kF32 ? launch_adamw<W, M, float>(op) : launch_adamw<W, M, uint16_t>(op);
}
template <typename W>
void adamw_moments(const AdamWOp& op) {
  op.moments_dtype == DType::kF32 ? adamw_grads<W, float>(op) : adamw_grads<W, uint16_t>(op);
}

int as_int(int64_t value, const char* what) {
  EMU_CUDA_REQUIRE(value >= 0 && value <= INT_MAX,
                   std::string(what) + " = " + std::to_string(value) + " passes cuBLAS's int limit");
  return static_cast<int>(value);
}

class CudaOps final : public Ops {
 public:
  explicit CudaOps(int gpu) : gpu_(gpu) {
    EMU_CUDA_CHECK(cudaSetDevice(gpu_));
    EMU_CUBLAS_CHECK(cublasCreate(&blas_));
    EMU_CUBLAS_CHECK(cublasSetStream(blas_, nullptr));
    EMU_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH));  // no TF32, no reduced-precision shortcuts
    int shared = 0;
    EMU_CUDA_CHECK(cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, gpu_));
    shared_per_block_ = static_cast<size_t>(shared);
  }
  ~CudaOps() override { cublasDestroy(blas_); }

  std::string_view backend() const override { return "cuda"; }
  void synchronize() override { EMU_CUDA_CHECK(cudaStreamSynchronize(nullptr)); }

  void bf16_to_f32(const uint16_t* x, float* y, size_t n) override { launch(k_bf16_to_f32, n, x, y, n); }
  void f32_to_bf16(const float* x, uint16_t* y, size_t n) override { launch(k_f32_to_bf16, n, x, y, n); }

  void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in,
                      int64_t out, WeightLayout layout) override {
    linear_forward_typed(x, w, CUDA_R_32F, bias, y, rows, in, out, layout);
  }
  void linear_forward_bf16(const uint16_t* x, const uint16_t* w, const float* bias, float* y, int64_t rows, int64_t in,
                           int64_t out, WeightLayout layout) override {
    linear_forward_typed(x, w, CUDA_R_16BF, bias, y, rows, in, out, layout);
  }
  void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* dbias,
                       int64_t rows, int64_t in, int64_t out, WeightLayout layout, bool accumulate_dx) override {
    const float beta = accumulate_dx ? 1 : 0;
    const auto f = CUDA_R_32F;
    if (layout == WeightLayout::kOutIn) {
      gemm(true, false, out, in, rows, 1, dy, f, out, x, f, in, 1, dw, in);
      if (dx != nullptr) gemm(false, false, rows, in, out, 1, dy, f, out, w, f, in, beta, dx, in);
    } else {
      gemm(true, false, in, out, rows, 1, x, f, in, dy, f, out, 1, dw, out);
      if (dx != nullptr) gemm(false, true, rows, in, out, 1, dy, f, out, w, f, out, beta, dx, in);
    }
    if (dbias != nullptr) launch(k_column_sums, size_t(out), dy, dbias, rows, out);
  }

  void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim,
                       float eps) override {
    if (rows == 0) return;
    k_rmsnorm_forward<<<unsigned(rows), kThreads>>>(x, w, y, rstd, dim, eps);
    EMU_CUDA_CHECK_LAUNCH();
  }
  void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                        int64_t rows, int64_t dim) override {
    if (rows == 0) return;
    k_rmsnorm_backward_dx<<<unsigned(rows), kThreads>>>(dy, x, w, rstd, dx, dim);
    EMU_CUDA_CHECK_LAUNCH();
    launch(k_rmsnorm_backward_dw, size_t(dim), dy, x, rstd, dw, rows, dim);
  }
  void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                         int64_t rows, int64_t dim, float eps) override {
    if (rows == 0) return;
    k_layernorm_forward<<<unsigned(rows), kThreads>>>(x, w, b, y, mean, rstd, dim, eps);
    EMU_CUDA_CHECK_LAUNCH();
  }
  void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                          float* dx, float* dw, float* db, int64_t rows, int64_t dim) override {
    if (rows == 0) return;
    k_layernorm_backward_dx<<<unsigned(rows), kThreads>>>(dy, x, w, mean, rstd, dx, dim);
    EMU_CUDA_CHECK_LAUNCH();
    launch(k_layernorm_backward_dwdb, size_t(dim), dy, x, mean, rstd, dw, db, rows, dim);
  }

  void rope_apply(float* x, const float* cos, const float* sin, int64_t rows, int64_t seq, int64_t heads,
                  int64_t head_dim, int64_t rotary_dim, bool backward) override {
    launch(k_rope, size_t(rows * heads * (rotary_dim / 2)), x, cos, sin, rows, seq, heads, head_dim, rotary_dim,
           backward ? -1.0f : 1.0f);
  }

  void gelu_forward(const float* x, float* y, size_t n) override { launch(k_gelu_forward, n, x, y, n); }
  void gelu_backward(const float* dy, const float* x, float* dx, size_t n) override {
    launch(k_gelu_backward, n, dy, x, dx, n);
  }
  void swiglu_forward(const float* g, const float* u, float* y, size_t n) override {
    launch(k_swiglu_forward, n, g, u, y, n);
  }
  void swiglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) override {
    launch(k_swiglu_backward, n, dy, g, u, dg, du, n);
  }
  void geglu_forward(const float* g, const float* u, float* y, size_t n) override {
    launch(k_geglu_forward, n, g, u, y, n);
  }
  void geglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) override {
    launch(k_geglu_backward, n, dy, g, u, dg, du, n);
  }
  void scale(float* y, float alpha, size_t n) override { launch(k_scale, n, y, alpha, n); }
  void softcap_forward(float* y, float* t, float cap, size_t n) override { launch(k_softcap_forward, n, y, t, cap, n); }
  void softcap_backward(float* dy, const float* t, size_t n) override { launch(k_softcap_backward, n, dy, t, n); }

  void embedding_forward(const int32_t* tokens, const float* table, const float* positions, float* y, int64_t rows,
                         int64_t seq, int64_t dim) override {
    launch(k_embedding_forward, size_t(rows * dim), tokens, table, positions, y, rows, seq, dim);
  }
  void embedding_backward(const int32_t* tokens, const float* dy, float* dtable, float* dpositions, int64_t rows,
                          int64_t seq, int64_t dim) override {
    launch(k_embedding_backward, size_t(dim), tokens, dy, dtable, dpositions, rows, seq, dim);
  }

  double cross_entropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab, float grad_scale) override {
    if (rows == 0) return 0;
    double* loss = nullptr;
    int* bad = nullptr;
    EMU_CUDA_CHECK(cudaMalloc(&loss, sizeof(double) * size_t(rows)));  // scratch a fused kernel keeps on chip
    EMU_CUDA_CHECK(cudaMalloc(&bad, sizeof(int)));
    EMU_CUDA_CHECK(cudaMemset(bad, 0, sizeof(int)));
    k_cross_entropy<<<unsigned(rows), kThreads>>>(logits, targets, loss, bad, vocab, grad_scale);
    EMU_CUDA_CHECK_LAUNCH();
    std::vector<double> host(static_cast<size_t>(rows));
    int host_bad = 0;
    EMU_CUDA_CHECK(cudaMemcpy(host.data(), loss, sizeof(double) * host.size(), cudaMemcpyDeviceToHost));
    EMU_CUDA_CHECK(cudaMemcpy(&host_bad, bad, sizeof(int), cudaMemcpyDeviceToHost));
    EMU_CUDA_CHECK(cudaFree(loss));
    EMU_CUDA_CHECK(cudaFree(bad));
    EMU_CUDA_REQUIRE(host_bad == 0, "a target is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    double sum = 0;
    for (double value : host) sum += value;  // in row order, as the CPU sums
    return sum;
  }

  void attention_forward_classic(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                 float* probs, float* out) override {
    EMU_CUDA_REQUIRE(shape.scale == 0 && shape.softcap == 0, "the CUDA attention kernels scale by 1/sqrt(d), uncapped");
    attention_forward(shape, q, k, v, probs, out, nullptr, shared_per_block_);
  }
  void attention_forward_flash(const AttentionShape& shape, const float* q, const float* k, const float* v, float* out,
                               float* lse) override {
    EMU_CUDA_REQUIRE(shape.scale == 0 && shape.softcap == 0, "the CUDA attention kernels scale by 1/sqrt(d), uncapped");
    attention_forward(shape, q, k, v, nullptr, out, lse, shared_per_block_);
  }
  void attention_backward_classic(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                  const float* probs, const float* out, const float* dout, float* dq, float* dk,
                                  float* dv, float* dscores) override {
    EMU_CUDA_REQUIRE(shape.scale == 0 && shape.softcap == 0, "the CUDA attention kernels scale by 1/sqrt(d), uncapped");
    attention_backward(shape, q, k, v, probs, nullptr, out, dout, dq, dk, dv, dscores, shared_per_block_, *this);
  }
  void attention_backward_flash(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                const float* out, const float* lse, const float* dout, float* dq, float* dk,
                                float* dv) override {
    EMU_CUDA_REQUIRE(shape.scale == 0 && shape.softcap == 0, "the CUDA attention kernels scale by 1/sqrt(d), uncapped");
    attention_backward(shape, q, k, v, nullptr, lse, out, dout, dq, dk, dv, nullptr, shared_per_block_, *this);
  }

  void add(const float* a, const float* b, float* y, size_t n) override { launch(k_add, n, a, b, y, n); }
  void accumulate(float* y, const float* x, size_t n) override { launch(k_accumulate, n, y, x, n); }
  void accumulate_bf16(uint16_t* y, const float* x, size_t n) override { launch(k_accumulate_bf16, n, y, x, n); }

  void adamw(const AdamWOp& op) override {
    if (op.n == 0) return;
    op.weights_dtype == DType::kF32 ? adamw_moments<float>(op) : adamw_moments<uint16_t>(op);
    EMU_CUDA_CHECK_LAUNCH();
  }

  // Zero bytes give nullptr, which scratch_free accepts.
  void* scratch_allocate(size_t bytes, bool zero) override {
    if (bytes == 0) return nullptr;
    void* data = nullptr;
    EMU_CUDA_CHECK(cudaMallocAsync(&data, bytes, nullptr));
    if (zero) EMU_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, nullptr));
    return data;
  }
  void scratch_free(void* data, size_t) override {
    if (data != nullptr) EMU_CUDA_CHECK(cudaFreeAsync(data, nullptr));
  }
  // Synchronous: the host buffer may be reused as soon as this returns.
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) EMU_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes > 0) EMU_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, nullptr));
  }

 private:
  // Row-major C [M, N] = alpha · op(A) · op(B) + beta · C, as cblas_sgemm(CblasRowMajor, ...): cuBLAS is
  // column-major, so it computes Cᵀ = op(B)ᵀ · op(A)ᵀ with the operands swapped. fp32 accumulation.
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
            cudaDataType a_type, int64_t lda, const void* b, cudaDataType b_type, int64_t ldb, float beta, float* c,
            int64_t ldc) {
    if (m == 0 || n == 0) return;
    EMU_CUBLAS_CHECK(cublasGemmEx(blas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  as_int(n, "n"), as_int(m, "m"), as_int(k, "k"), &alpha, b, b_type, as_int(ldb, "ldb"),
                                  a, a_type, as_int(lda, "lda"), &beta, c, CUDA_R_32F, as_int(ldc, "ldc"),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void linear_forward_typed(const void* x, const void* w, cudaDataType type, const float* bias, float* y, int64_t rows,
                            int64_t in, int64_t out, WeightLayout layout) {
    float beta = 0;
    if (bias != nullptr) {
      launch(k_fill_rows, size_t(rows * out), bias, y, rows, out);
      beta = 1;
    }
    if (layout == WeightLayout::kOutIn) {
      gemm(false, true, rows, out, in, 1, x, type, in, w, type, in, beta, y, out);
    } else {
      gemm(false, false, rows, out, in, 1, x, type, in, w, type, out, beta, y, out);
    }
  }

  int gpu_;
  size_t shared_per_block_ = 0;  // opt-in maximum of shared memory per block
  cublasHandle_t blas_ = nullptr;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(int gpu) { return std::make_unique<CudaOps>(gpu); }

}  // namespace emu::cuda
