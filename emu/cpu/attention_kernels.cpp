#include "emu/cpu/attention_kernels.h"

#include <cblas.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "emu/cpu/ordered_products.h"

namespace emu::cpu {
namespace {

// Host scratch aligned for Eigen's widest packets: Eigen peels unaligned leading elements before its vectorised
// sums, so a sum over memory whose alignment changed from run to run would change its order and its result.
using Tile = std::vector<float, Eigen::aligned_allocator<float>>;

// Where head `head` of sequence `seq_index` lies in the row-major [T, heads·d] tensors.
struct HeadView {
  int64_t s, d, q_stride, kv_stride, out_stride;  // rows, head dimension, row strides of q, k/v and out
  int64_t q_offset, kv_offset, out_offset;        // first element of this head's block in q, k/v and out
  float scale, softcap;                           // AttentionShape's, the scale resolved
  bool ordered;  // the score-shaped products through ordered_scores (ordered_products.h) instead of sgemm
};

HeadView view(const AttentionShape& shape, int64_t seq_index, int64_t head) {
  const int64_t group = shape.heads / shape.kv_heads;
  const int64_t row0 = seq_index * shape.seq;
  HeadView v;
  v.s = shape.seq;
  v.d = shape.head_dim;
  v.out_stride = shape.heads * shape.head_dim;
  v.q_stride = shape.q_stride != 0 ? shape.q_stride : v.out_stride;
  v.kv_stride = shape.kv_stride != 0 ? shape.kv_stride : shape.kv_heads * shape.head_dim;
  v.q_offset = row0 * v.q_stride + head * shape.head_dim;
  v.kv_offset = row0 * v.kv_stride + (head / group) * shape.head_dim;
  v.out_offset = row0 * v.out_stride + head * shape.head_dim;
  v.scale = shape.scale != 0 ? shape.scale : 1.0f / std::sqrt(static_cast<float>(v.d));
  v.softcap = shape.softcap;
  // Soft-capped scores keep sgemm: their tanh runs over the whole [s, s] tile.
  v.ordered = v.softcap == 0 && v.d >= 1 && v.d <= kOrderedMaxHeadDim && v.s <= kOrderedMaxSeq &&
              ordered_products_match(v.s, v.d);
  return v;
}

// out [s, s] = x·yᵀ·alpha for one head, x and y [s, d] at the given offsets and strides; with v.ordered only the
// columns j ≤ i of each row i are written, the rest is left as it was (the causal mask overwrites it).
void score_product(const HeadView& v, const float* x, int64_t x_stride, const float* y, int64_t y_stride, float alpha,
                   float* out) {
  if (!v.ordered) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, v.s, v.s, v.d, alpha, x, x_stride, y, y_stride, 0, out, v.s);
    return;
  }
  float yt[kOrderedMaxHeadDim * kOrderedMaxSeq];  // yᵀ [d, s]
  transpose_head({y, y_stride}, v.s, v.d, yt);
  ordered_scores({x, x_stride}, yt, v.s, v.d, alpha, out);
}

// scores [s, s] = q·kᵀ·scale for one head, soft-capped to cap·tanh(scores/cap) when the shape says so (transformers
// models/gemma2 eager_attention_forward: after the scale, before the mask). With v.ordered, only j ≤ i is written.
void scores(const HeadView& v, const float* q, const float* k, float* s) {
  score_product(v, q + v.q_offset, v.q_stride, k + v.kv_offset, v.kv_stride, v.scale, s);
  if (v.softcap == 0) return;
  Eigen::Map<Eigen::ArrayXf> all(s, v.s * v.s);
  all = (all * (1.0f / v.softcap)).tanh() * v.softcap;
}

// Soft-capping's backward on dS [s, s] of one head: d(raw) = dS · (1 − tanh²(raw/cap)), tanh = capped/cap recomputed
// from q and k (`work` [s, s]).
void softcap_backward(const HeadView& v, const float* q, const float* k, float* ds, float* work) {
  if (v.softcap == 0) return;
  scores(v, q, k, work);
  Eigen::Map<Eigen::ArrayXf> t(work, v.s * v.s), g(ds, v.s * v.s);
  t *= 1.0f / v.softcap;
  g *= 1.0f - t.square();
}

// In place: causal softmax of each row of scores [s, s]; lse[i] receives each row's logsumexp when not null.
void causal_softmax(int64_t s, float* p, float* lse) {
  for (int64_t i = 0; i < s; ++i) {
    Eigen::Map<Eigen::ArrayXf> row(p + i * s, i + 1);  // the unmasked part, j ≤ i
    const float max = row.maxCoeff();
    row = (row - max).exp();
    const float sum = row.sum();
    row *= 1.0f / sum;
    std::fill(p + i * s + i + 1, p + (i + 1) * s, 0.0f);
    if (lse != nullptr) lse[i] = max + std::log(sum);
  }
}

// out_head [s, d] = P·v.
void apply(const HeadView& v, const float* p, const float* vv, float* out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, v.s, v.d, v.s, 1, p, v.s, vv + v.kv_offset, v.kv_stride, 0,
              out + v.out_offset, v.out_stride);
}

// Given P [s, s] of one head, the gradients: dS in `ds` [s, s] (work area), dq written, dk and dv accumulated.
void head_backward(const HeadView& v, const float* q, const float* k, const float* vv, const float* p, const float* out,
                   const float* dout, float* dq, float* dk, float* dv, float* ds) {
  const float scale = v.scale;
  // dP = dout·vᵀ (j ≤ i only, with v.ordered: the rest is masked below)
  score_product(v, dout + v.out_offset, v.out_stride, vv + v.kv_offset, v.kv_stride, 1, ds);
  // dS = P ⊙ (dP − rowsum(dout ⊙ out)); rowsum(dP ⊙ P) equals rowsum(dout ⊙ out).
  for (int64_t i = 0; i < v.s; ++i) {
    const float* o = out + v.out_offset + i * v.out_stride;
    const float* g = dout + v.out_offset + i * v.out_stride;
    float dot = 0;
    for (int64_t e = 0; e < v.d; ++e) dot += o[e] * g[e];
    float* row = ds + i * v.s;
    const float* prow = p + i * v.s;
    for (int64_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - dot);
    std::fill(row + i + 1, row + v.s, 0.0f);
  }
  if (v.softcap != 0) {
    Tile work(static_cast<size_t>(v.s * v.s));
    softcap_backward(v, q, k, ds, work.data());
  }
  // dq = dS·k/√d; dk += dSᵀ·q/√d; dv += Pᵀ·dout
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, v.s, v.d, v.s, scale, ds, v.s, k + v.kv_offset, v.kv_stride, 0,
              dq + v.q_offset, v.q_stride);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, v.s, v.d, v.s, scale, ds, v.s, q + v.q_offset, v.q_stride, 1,
              dk + v.kv_offset, v.kv_stride);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, v.s, v.d, v.s, 1, p, v.s, dout + v.out_offset, v.out_stride, 1,
              dv + v.kv_offset, v.kv_stride);
}

// dk and dv are accumulated over the heads of a group, so they start at zero.
void zero_kv_grads(const AttentionShape& shape, float* dk, float* dv) {
  const int64_t width = shape.kv_heads * shape.head_dim;
  const int64_t stride = shape.kv_stride != 0 ? shape.kv_stride : width;
  for (int64_t r = 0; r < shape.batch * shape.seq; ++r) {
    std::fill(dk + r * stride, dk + r * stride + width, 0.0f);
    std::fill(dv + r * stride, dv + r * stride + width, 0.0f);
  }
}

}  // namespace

void attention_forward_classic(const AttentionShape& shape, const float* q, const float* k, const float* v,
                               float* probs, float* out) {
  const int64_t ss = shape.seq * shape.seq;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t head = 0; head < shape.heads; ++head) {
      const HeadView hv = view(shape, b, head);
      float* p = probs + (b * shape.heads + head) * ss;
      scores(hv, q, k, p);
      causal_softmax(hv.s, p, nullptr);
      apply(hv, p, v, out);
    }
  }
}

void attention_forward_flash(const AttentionShape& shape, const float* q, const float* k, const float* v, float* out,
                             float* lse) {
  Tile tile(static_cast<size_t>(shape.seq * shape.seq));  // [s, s] host scratch, see attention_kernels.h
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t head = 0; head < shape.heads; ++head) {
      const HeadView hv = view(shape, b, head);
      scores(hv, q, k, tile.data());
      causal_softmax(hv.s, tile.data(), lse + (b * shape.heads + head) * shape.seq);
      apply(hv, tile.data(), v, out);
    }
  }
}

void attention_backward_classic(const AttentionShape& shape, const float* q, const float* k, const float* v,
                                const float* probs, const float* out, const float* dout, float* dq, float* dk,
                                float* dv, float* dscores) {
  zero_kv_grads(shape, dk, dv);
  const int64_t ss = shape.seq * shape.seq;
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t head = 0; head < shape.heads; ++head) {
      const int64_t at = (b * shape.heads + head) * ss;
      head_backward(view(shape, b, head), q, k, v, probs + at, out, dout, dq, dk, dv, dscores + at);
    }
  }
}

void attention_backward_flash(const AttentionShape& shape, const float* q, const float* k, const float* v,
                              const float* out, const float* lse, const float* dout, float* dq, float* dk, float* dv) {
  zero_kv_grads(shape, dk, dv);
  const size_t ss = static_cast<size_t>(shape.seq * shape.seq);
  Tile p(ss), ds(ss);  // [s, s] host scratch each, see attention_kernels.h
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t head = 0; head < shape.heads; ++head) {
      const HeadView hv = view(shape, b, head);
      const float* row_lse = lse + (b * shape.heads + head) * shape.seq;
      scores(hv, q, k, p.data());
      for (int64_t i = 0; i < hv.s; ++i) {
        float* row = p.data() + i * hv.s;
        Eigen::Map<Eigen::ArrayXf>(row, i + 1) = (Eigen::Map<Eigen::ArrayXf>(row, i + 1) - row_lse[i]).exp();
        std::fill(row + i + 1, row + hv.s, 0.0f);
      }
      head_backward(hv, q, k, v, p.data(), out, dout, dq, dk, dv, ds.data());
    }
  }
}

}  // namespace emu::cpu
