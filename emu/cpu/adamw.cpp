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

// One run of k.n elements, all inside a decay range (k.decay) or all outside.
template <typename W, typename M, typename G>
void update_run(W* w, M* m, M* v, const G* g, const AdamWOp& k) {
  uint16_t* copy = k.copy;
  for (size_t i = 0; i < k.n; ++i) {
    const float grad = load(g, i) * k.grad_scale;
    float weight = load(w, i);
    if (k.decay) weight *= k.decay_factor;
    const float m_new = k.beta1 * load(m, i) + k.one_minus_beta1 * grad;
    const float v_new = k.beta2 * load(v, i) + k.one_minus_beta2 * grad * grad;
    const float denom = std::sqrt(v_new) / k.bias_correction2_sqrt + k.eps;
    weight -= k.step_size * m_new / denom;
    store(m, i, m_new);
    store(v, i, v_new);
    store(w, i, weight);
    if (copy != nullptr) copy[i] = float_to_bf16(weight);
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
