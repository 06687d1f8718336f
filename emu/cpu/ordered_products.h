// The score-shaped products of one attention head (q·kᵀ and dout·vᵀ: [s, d] × [d, s]), written out so that each
// element rounds exactly as OpenBLAS's sgemm rounds it with beta 0: alpha·acc, acc the d products summed in order,
// one fused multiply-add each, from +0. A head of a shrunk model is tiny (llama2-13b at k = 64: 40 heads of
// dimension 2, 64 positions), and sgemm's call, packing and zero-filling of the [s, s] result then cost more than
// its arithmetic; these loops skip that work, and the scores above the causal diagonal, which the softmax masks.
//
// Whether this machine's sgemm rounds so is measured, not assumed: ordered_products_match(s, d) computes the product
// both ways on the head's shape with seeded values (signed, with zeros) and compares the bits; attention uses these
// loops only where they agree (attention_kernels.cpp), and cblas_sgemm otherwise.
#pragma once

#include <cstdint>

namespace emu::cpu {

// Heads up to this dimension and sequences up to this length take the ordered loops (when they match sgemm);
// larger ones are sgemm's real work.
inline constexpr int64_t kOrderedMaxHeadDim = 16;
inline constexpr int64_t kOrderedMaxSeq = 256;

// One head's operands: x [s, d] rows at x_stride (q, dout, k or v of the head).
struct HeadRows {
  const float* data;
  int64_t stride;
};

// out [s, s], columns j ≤ i of each row i: alpha · Σ_e x[i, e] · y[j, e] (sgemm NoTrans × Trans, K = d); the
// columns past the diagonal are left as they were. `yt` [d, s] is y transposed, from transpose_head; 1 ≤ d ≤
// kOrderedMaxHeadDim.
void ordered_scores(HeadRows x, const float* yt, int64_t s, int64_t d, float alpha, float* out);
// yt [d, s] = yᵀ.
void transpose_head(HeadRows y, int64_t s, int64_t d, float* yt);
// Whether ordered_scores gives sgemm's bits on a head of s positions and dimension d (measured once per shape).
bool ordered_products_match(int64_t s, int64_t d);

}  // namespace emu::cpu
