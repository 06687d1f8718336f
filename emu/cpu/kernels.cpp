#include "emu/cpu/kernels.h"

#include <cblas.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "emu/check.h"

namespace emu::cpu {

namespace {
// Element-wise work through Eigen's vectorised arrays, in chunks small enough that a chunk's temporaries stay in
// cache (and on the stack).
using ArrayMap = Eigen::Map<Eigen::ArrayXf>;
using ConstArrayMap = Eigen::Map<const Eigen::ArrayXf>;
constexpr size_t kChunk = 2048;
using Chunk = Eigen::Array<float, Eigen::Dynamic, 1, 0, static_cast<int>(kChunk), 1>;

template <typename Body>
void for_chunks(size_t n, Body body) {
  for (size_t at = 0; at < n; at += kChunk) body(at, static_cast<Eigen::Index>(std::min(kChunk, n - at)));
}
}  // namespace

void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t rows, int64_t in, int64_t out,
                    WeightLayout layout) {
  float beta = 0;
  if (bias != nullptr) {
    for (int64_t r = 0; r < rows; ++r) std::copy(bias, bias + out, y + r * out);
    beta = 1;
  }
  if (layout == WeightLayout::kOutIn) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1, x, in, w, in, beta, y, out);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, out, in, 1, x, in, w, out, beta, y, out);
  }
}

void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* dbias, int64_t rows,
                     int64_t in, int64_t out, WeightLayout layout, bool accumulate_dx) {
  const float beta = accumulate_dx ? 1 : 0;
  if (layout == WeightLayout::kOutIn) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, rows, 1, dy, out, x, in, 1, dw, in);
    if (dx != nullptr) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, in, out, 1, dy, out, w, in, beta, dx, in);
    }
  } else {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, rows, 1, x, in, dy, out, 1, dw, out);
    if (dx != nullptr) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, in, out, 1, dy, out, w, out, beta, dx, in);
    }
  }
  if (dbias != nullptr) {
    for (int64_t r = 0; r < rows; ++r) accumulate(dbias, dy + r * out, static_cast<size_t>(out));
  }
}

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0;
    for (int64_t j = 0; j < dim; ++j) sum += double(xr[j]) * xr[j];
    const float s = static_cast<float>(1.0 / std::sqrt(sum / double(dim) + eps));
    rstd[r] = s;
    for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * s * w[j];
  }
}

void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                      int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* dyr = dy + r * dim;
    float* dxr = dx + r * dim;
    const float s = rstd[r];
    double dot = 0;  // Σ_j dy_j w_j x_j
    for (int64_t j = 0; j < dim; ++j) {
      dot += double(dyr[j]) * w[j] * xr[j];
      dw[j] += dyr[j] * xr[j] * s;
    }
    const float c = static_cast<float>(dot / double(dim)) * s * s * s;
    for (int64_t j = 0; j < dim; ++j) dxr[j] += s * dyr[j] * w[j] - c * xr[j];
  }
}

void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd, int64_t rows,
                       int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0;
    for (int64_t j = 0; j < dim; ++j) sum += xr[j];
    const double mu = sum / double(dim);
    double var = 0;
    for (int64_t j = 0; j < dim; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    const float s = static_cast<float>(1.0 / std::sqrt(var / double(dim) + eps));
    const float m = static_cast<float>(mu);
    mean[r] = m;
    rstd[r] = s;
    for (int64_t j = 0; j < dim; ++j) yr[j] = (xr[j] - m) * s * w[j] + b[j];
  }
}

void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float* dyr = dy + r * dim;
    float* dxr = dx + r * dim;
    const float m = mean[r], s = rstd[r];
    double sum_g = 0, sum_gx = 0;  // Σ dxhat, Σ dxhat·xhat
    for (int64_t j = 0; j < dim; ++j) {
      const float xhat = (xr[j] - m) * s;
      const float g = dyr[j] * w[j];
      sum_g += g;
      sum_gx += double(g) * xhat;
      dw[j] += dyr[j] * xhat;
      db[j] += dyr[j];
    }
    const float mg = static_cast<float>(sum_g / double(dim)), mgx = static_cast<float>(sum_gx / double(dim));
    for (int64_t j = 0; j < dim; ++j) {
      const float xhat = (xr[j] - m) * s;
      dxr[j] += s * (dyr[j] * w[j] - mg - xhat * mgx);
    }
  }
}

namespace {
// One rotation pair (v[j], v[j + half]) of one head, the same expression whichever loop runs it.
inline void rotate_pair(float* v, int64_t j, int64_t half, float c, float s) {
  const float a = v[j], b = v[j + half];
  v[j] = a * c - b * s;
  v[j + half] = b * c + a * s;
}
}  // namespace

void rope_apply(float* x, const float* cos, const float* sin, int64_t rows, int64_t seq, int64_t heads,
                int64_t head_dim, int64_t rotary_dim, bool backward) {
  const int64_t half = rotary_dim / 2;
  const float sign = backward ? -1.0f : 1.0f;
  // Narrow heads (a shrunk model's head dimension of 2 or 4) turn one pair index across all heads of a row, so that
  // the loop runs long enough to be vector code; wide heads run along the head.
  constexpr int64_t kNarrowHalf = 8;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + (r % seq) * half;
    const float* sn = sin + (r % seq) * half;
    float* row = x + r * heads * head_dim;
    if (half < kNarrowHalf) {
      for (int64_t j = 0; j < half; ++j) {
        const float cj = c[j], s = sign * sn[j];
        for (int64_t head = 0; head < heads; ++head) rotate_pair(row + head * head_dim, j, half, cj, s);
      }
      continue;
    }
    for (int64_t head = 0; head < heads; ++head) {
      for (int64_t j = 0; j < half; ++j) rotate_pair(row + head * head_dim, j, half, c[j], sign * sn[j]);
    }
  }
}

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
}  // namespace

void gelu_forward(const float* x, float* y, size_t n) {
  for_chunks(n, [&](size_t at, Eigen::Index m) {
    const ConstArrayMap v(x + at, m);
    ArrayMap(y + at, m) = 0.5f * v * (1.0f + (kSqrt2OverPi * (v + kGeluCubic * v.cube())).tanh());
  });
}

void gelu_backward(const float* dy, const float* x, float* dx, size_t n) {
  for_chunks(n, [&](size_t at, Eigen::Index m) {
    const ConstArrayMap v(x + at, m);
    const Chunk t = (kSqrt2OverPi * (v + kGeluCubic * v.cube())).tanh();
    const Chunk du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v.square());
    ArrayMap(dx + at, m) = ConstArrayMap(dy + at, m) * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t.square()) * du);
  });
}

void swiglu_forward(const float* g, const float* u, float* y, size_t n) {
  for_chunks(n, [&](size_t at, Eigen::Index m) {
    const ConstArrayMap gate(g + at, m);
    ArrayMap(y + at, m) = gate / (1.0f + (-gate).exp()) * ConstArrayMap(u + at, m);
  });
}

void swiglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) {
  for_chunks(n, [&](size_t at, Eigen::Index m) {
    const ConstArrayMap gate(g + at, m), grad(dy + at, m);
    const Chunk sig = 1.0f / (1.0f + (-gate).exp());
    ArrayMap(dg + at, m) = grad * ConstArrayMap(u + at, m) * sig * (1.0f + gate * (1.0f - sig));
    ArrayMap(du + at, m) = grad * gate * sig;
  });
}

void geglu_forward(const float* g, const float* u, float* y, size_t n) {
  for_chunks(n, [&](size_t at, Eigen::Index m) {
    const ConstArrayMap v(g + at, m);
    ArrayMap(y + at, m) =
        0.5f * v * (1.0f + (kSqrt2OverPi * (v + kGeluCubic * v.cube())).tanh()) * ConstArrayMap(u + at, m);
  });
}

void geglu_backward(const float* dy, const float* g, const float* u, float* dg, float* du, size_t n) {
  for_chunks(n, [&](size_t at, Eigen::Index m) {
    const ConstArrayMap v(g + at, m), grad(dy + at, m);
    const Chunk t = (kSqrt2OverPi * (v + kGeluCubic * v.cube())).tanh();
    const Chunk slope = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v.square());
    ArrayMap(dg + at, m) =
        grad * ConstArrayMap(u + at, m) * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t.square()) * slope);
    ArrayMap(du + at, m) = grad * 0.5f * v * (1.0f + t);
  });
}

void scale(float* y, float alpha, size_t n) {
  for_chunks(n, [&](size_t at, Eigen::Index m) { ArrayMap(y + at, m) *= alpha; });
}

void embedding_forward(const int32_t* tokens, const float* table, const float* positions, float* y, int64_t rows,
                       int64_t seq, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = table + int64_t(tokens[r]) * dim;
    float* yr = y + r * dim;
    if (positions == nullptr) {
      std::copy(row, row + dim, yr);
    } else {
      add(row, positions + (r % seq) * dim, yr, static_cast<size_t>(dim));
    }
  }
}

void embedding_backward(const int32_t* tokens, const float* dy, float* dtable, float* dpositions, int64_t rows,
                        int64_t seq, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    accumulate(dtable + int64_t(tokens[r]) * dim, dy + r * dim, static_cast<size_t>(dim));
    if (dpositions != nullptr) accumulate(dpositions + (r % seq) * dim, dy + r * dim, static_cast<size_t>(dim));
  }
}

double cross_entropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab, float grad_scale) {
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ArrayMap l(logits + r * vocab, vocab);
    const int32_t target = targets[r];
    EMU_CHECK(target >= 0 && target < vocab, "target {} of row {} is outside the vocabulary [0, {})", target, r, vocab);
    const float max = l.maxCoeff();
    const float lse = max + std::log((l - max).exp().sum());
    loss += double(lse) - double(l[target]);
    l = (l - lse).exp() * grad_scale;
    l[target] -= grad_scale;
  }
  return loss;
}

void add(const float* a, const float* b, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void accumulate(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace emu::cpu
