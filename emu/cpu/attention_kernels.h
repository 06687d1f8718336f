// The CPU backend's causal multi-head / grouped-query attention, in fp32: classic and flash-style.
//
// q is [T, a·d], k and v are [T, kv·d], out is [T, a·d] (T = b·s rows, head h reading key/value head h / (a/kv)).
// q, k, v and their gradients may be column blocks of a wider tensor (GPT-2's fused [T, 3h] qkv): their row
// strides are q_stride and kv_stride.
// Classic keeps the probabilities P [b, a, s, s] for backward. Flash-style keeps only out and the logsumexp of
// each score row, lse [b, a, s], and recomputes P from q, k and lse in backward, as a flash kernel does; its
// per-head s × s tiles are host scratch that a GPU kernel would keep in on-chip memory, so it is not charged.
#pragma once

#include <cstdint>

#include "emu/ops.h"

namespace emu::cpu {

// probs [b, a, s, s] receives softmax(q·kᵀ/√d) with the causal mask (zeros above the diagonal).
void attention_forward_classic(const AttentionShape& shape, const float* q, const float* k, const float* v,
                               float* probs, float* out);
// lse [b, a, s] receives the logsumexp of each scaled, masked score row.
void attention_forward_flash(const AttentionShape& shape, const float* q, const float* k, const float* v, float* out,
                             float* lse);

// dq, dk, dv are overwritten. dscores [b, a, s, s] is the work area for the score gradients (a tensor classic
// attention's backward really allocates).
void attention_backward_classic(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                const float* probs, const float* out, const float* dout, float* dq, float* dk,
                                float* dv, float* dscores);
void attention_backward_flash(const AttentionShape& shape, const float* q, const float* k, const float* v,
                              const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv);

}  // namespace emu::cpu
