// The CPU backend's AdamW: the element-wise update of emu::AdamWOp over host memory, its step constants computed
// by the caller (optim::adamw_update, which runs it through Ops::adamw). fp32 arithmetic per element whatever the
// storage; bf16 weights, moments and the copy are rounded to nearest even on store.
#include "emu/cpu/adamw.h"

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "emu/bf16.h"

namespace emu::cpu {
namespace {

// Storage access for the two element types: fp32 as is, bf16 as bit patterns rounded to nearest even on store.
inline float load(const float* data, size_t i) { return data[i]; }
inline float load(const uint16_t* data, size_t i) { return bf16_to_float(data[i]); }
inline void store(float* data, size_t i, float value) { data[i] = value; }
inline void store(uint16_t* data, size_t i, float value) { data[i] = float_to_bf16(value); }

// a·b + c, fused (one rounding) where the CPU has FMA, as the compiler contracted these two sums before this file
// was compiled with -ffp-contract=off (emu/CMakeLists.txt); the decay's product stays rounded on its own.
inline float multiply_add(float a, float b, float c) {
#ifdef __FP_FAST_FMAF
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// One run of k.n elements, all inside a decay range (k.decay) or all outside. The constants are read into locals and
// the arrays are distinct (__restrict), so that the loop compiles to vector code: each element's arithmetic is the
// same, in the same order, as element by element.
template <bool kDecay, bool kCopy, typename W, typename M, typename G>
void update_elements(W* __restrict w, M* __restrict m, M* __restrict v, const G* __restrict g,
                     uint16_t* __restrict copy, const AdamWOp& k) {
  const size_t n = k.n;
  const float grad_scale = k.grad_scale, decay_factor = k.decay_factor, beta1 = k.beta1, beta2 = k.beta2;
  const float one_minus_beta1 = k.one_minus_beta1, one_minus_beta2 = k.one_minus_beta2;
  const float bias_correction2_sqrt = k.bias_correction2_sqrt, eps = k.eps, step_size = k.step_size, l2 = k.l2;
  for (size_t i = 0; i < n; ++i) {
    float grad = load(g, i) * grad_scale;
    float weight = load(w, i);
    if constexpr (kDecay) {
      grad += l2 * weight;  // Adam's L2 decay (0 under AdamW)
      weight *= decay_factor;
    }
    const float m_new = multiply_add(beta1, load(m, i), one_minus_beta1 * grad);
    const float v_new = multiply_add(beta2, load(v, i), one_minus_beta2 * grad * grad);
    const float denom = std::sqrt(v_new) / bias_correction2_sqrt + eps;
    weight -= step_size * m_new / denom;
    store(m, i, m_new);
    store(v, i, v_new);
    store(w, i, weight);
    if constexpr (kCopy) copy[i] = float_to_bf16(weight);
  }
}

template <typename W, typename M, typename G>
void update_run(W* w, M* m, M* v, const G* g, const AdamWOp& k) {
  if (k.decay) {
    if (k.copy != nullptr) {
      update_elements<true, true>(w, m, v, g, k.copy, k);
    } else {
      update_elements<true, false>(w, m, v, g, k.copy, k);
    }
  } else if (k.copy != nullptr) {
    update_elements<false, true>(w, m, v, g, k.copy, k);
  } else {
    update_elements<false, false>(w, m, v, g, k.copy, k);
  }
}

template <typename W, typename M>
void apply_grads(const AdamWOp& op) {
  W* w = static_cast<W*>(op.weights);
  M* m = static_cast<M*>(op.m);
  M* v = static_cast<M*>(op.v);
  if (op.grads_dtype == DType::kF32) {
    update_run(w, m, v, static_cast<const float*>(op.grads), op);
  } else {
    update_run(w, m, v, static_cast<const uint16_t*>(op.grads), op);
  }
}

template <typename W>
void apply_moments(const AdamWOp& op) {
  if (op.moments_dtype == DType::kF32) {
    apply_grads<W, float>(op);
  } else {
    apply_grads<W, uint16_t>(op);
  }
}

}  // namespace

void adamw(const AdamWOp& op) {
  if (op.n == 0) return;
  if (op.weights_dtype == DType::kF32) {
    apply_moments<float>(op);
  } else {
    apply_moments<uint16_t>(op);
  }
}

}  // namespace emu::cpu
