// The CPU backend's kernels in fp32: matrix products through OpenBLAS, element-wise work in plain loops and Eigen.
// The CPU ops (cpu_ops.cpp) are these; the model reaches them only through emu::Ops.
//
// Every function works on row-major fp32 arrays of T rows (T = b·s tokens). Backward functions accumulate (+=)
// into weight and bias gradients, so a gradient buffer gathers a whole unit's contributions, and overwrite the
// input gradient unless they say otherwise. These functions know nothing of devices or dtypes: the caller turns
// bf16 tensors into fp32 working copies around them (Ops::bf16_to_f32 and f32_to_bf16).
#pragma once

#include <cstddef>
#include <cstdint>

#include "emu/ops.h"

namespace emu::cpu {

// y [T, out] = x [T, in] · W (+ bias [out] when not null).
void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in, int64_t out,
                    WeightLayout layout);
// dW += xᵀ·dy (laid out as W), dbias += Σ_rows dy (when not null), dx = dy · Wᵀ (dx += when accumulate_dx; no dx
// when null).
void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* dbias, int64_t rows,
                     int64_t in, int64_t out, WeightLayout layout, bool accumulate_dx);

// RMSNorm: y = x / sqrt(mean(x²) + eps) · w. rstd [T] keeps 1/sqrt(mean(x²) + eps) for backward.
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps);
// dx += ..., dw += ...
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                      int64_t rows, int64_t dim);

// LayerNorm: y = (x − mean) · rstd · w + b; mean [T] and rstd [T] kept for backward.
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t rows,
                       int64_t dim, float eps);
// dx += ..., dw += ..., db += ...
void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, int64_t rows, int64_t dim);

// Rotary embedding in place on x [T, heads·d], T = batch·seq rows with position = row mod seq, Hugging Face's
// rotate_half convention: within each head of dimension d, element j < d/2 pairs with j + d/2, rotated by the angle
// whose cos and sin are cos[pos, j] and sin[pos, j] ([seq, d/2], pos · theta^(−2j/d), made by the caller).
// backward = true rotates by −angle, which is the gradient of the forward rotation.
// Only the first rotary_dim dimensions of each head turn (tables [seq, rotary_dim/2]); the others pass through.
void rope_apply(float* x, const float* cos, const float* sin, int64_t rows, int64_t seq, int64_t heads,
                int64_t head_dim, int64_t rotary_dim, bool backward);

// GELU, tanh approximation (Hugging Face "gelu_new", GPT-2's activation): y = ½x(1 + tanh(√(2/π)(x + 0.044715x³))).
void gelu_forward(const float* x, float* y, size_t n);
// dx = dy · gelu'(x)
void gelu_backward(const float* dy, const float* x, float* dx, size_t n);

// SwiGLU: y = silu(g) · u, silu(g) = g · sigmoid(g).
void swiglu_forward(const float* g, const float* u, float* y, size_t n);
// dg = dy · u · silu'(g), du = dy · silu(g)
void swiglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n);
// GeGLU (Gemma's MLP): y = gelu_tanh(g) · u; backward dg = dy · u · gelu'(g), du = dy · gelu(g).
void geglu_forward(const float* g, const float* u, float* y, size_t n);
void geglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n);
// y *= alpha
void scale(float* y, float alpha, size_t n);

// y [T, h] = table[tokens[t]] (+ positions[t mod seq] when not null).
void embedding_forward(const int32_t* tokens, const float* table, const float* positions, float* y, int64_t rows,
                       int64_t seq, int64_t dim);
// dtable[tokens[t]] += dy[t]; dpositions[t mod seq] += dy[t] when not null.
void embedding_backward(const int32_t* tokens, const float* dy, float* dtable, float* dpositions, int64_t rows,
                        int64_t seq, int64_t dim);

// Cross-entropy over logits [T, V] against targets [T]: returns the summed loss Σ_t (logsumexp − logit[target]) in
// double and turns the logits in place into dlogits = (softmax − onehot) · grad_scale.
double cross_entropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab, float grad_scale);

// y = a + b, element-wise (the residual connection).
void add(const float* a, const float* b, float* y, size_t n);
// y += x
void accumulate(float* y, const float* x, size_t n);

}  // namespace emu::cpu
