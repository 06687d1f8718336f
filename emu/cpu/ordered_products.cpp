#include "emu/cpu/ordered_products.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace emu::cpu {

void transpose_head(HeadRows y, int64_t s, int64_t d, float* yt) {
  for (int64_t j = 0; j < s; ++j) {
    for (int64_t e = 0; e < d; ++e) yt[e * s + j] = y.data[j * y.stride + e];
  }
}

namespace {

// Row by row, one pass across the keys j ≤ i (vector code) with the head dimension D unrolled: each sum starts from
// +0, as sgemm's registers do, and takes the products in order of e.
template <int64_t D>
void head_scores(const float* __restrict x, int64_t x_stride, const float* __restrict yt, int64_t s, float alpha,
                 float* __restrict out) {
  for (int64_t i = 0; i < s; ++i) {
    float xi[D];
    for (int64_t e = 0; e < D; ++e) xi[e] = x[i * x_stride + e];
    float* __restrict row = out + i * s;
    for (int64_t j = 0; j <= i; ++j) {
      float acc = 0.0f;
      for (int64_t e = 0; e < D; ++e) acc = std::fma(xi[e], yt[e * s + j], acc);
      row[j] = alpha * acc;
    }
  }
}

using HeadScores = void (*)(const float*, int64_t, const float*, int64_t, float, float*);

template <size_t... I>
constexpr std::array<HeadScores, sizeof...(I)> head_scores_table(std::index_sequence<I...>) {
  return {&head_scores<int64_t(I) + 1>...};
}

// head_scores<d> for d = 1 … kOrderedMaxHeadDim.
constexpr auto kHeadScores = head_scores_table(std::make_index_sequence<size_t(kOrderedMaxHeadDim)>());

// Seeded operands in [−2, 2) with every seventh an exact zero and both signs, so that a sum fused or not, or
// started from −0, shows in the bits.
std::vector<float> probe_values(size_t n, uint32_t seed) {
  std::vector<float> values(n);
  for (size_t at = 0; at < n; ++at) {
    seed = seed * 1664525u + 1013904223u;
    values[at] = at % 7 == 3 ? 0.0f : static_cast<float>(seed >> 8) * 0x1p-22f - 2.0f;
  }
  return values;
}

// Over enough scores that an unfused sgemm cannot agree by chance: a small head has few (s = 1: one per alpha, and
// on OpenBLAS's Prescott kernels, which do not fuse, d = 3 agreed on the first seeds and not on others), so the
// product is taken again on further seeds until kProbeScores scores are compared, at most kProbeTrials times.
constexpr int64_t kProbeScores = 1024;
constexpr int64_t kProbeTrials = 64;

bool measure_match(int64_t s, int64_t d) {
  const int64_t causal = s * (s + 1) / 2;
  const int64_t trials = std::clamp<int64_t>((kProbeScores + causal - 1) / causal, 1, kProbeTrials);
  std::vector<float> blas(size_t(s * s)), mine(size_t(s * s)), yt(size_t(s * d));
  for (int64_t trial = 0; trial < trials; ++trial) {
    const auto seed = static_cast<uint32_t>(2 * trial);
    const std::vector<float> x = probe_values(size_t(s * d), seed + 1), y = probe_values(size_t(s * d), seed + 2);
    transpose_head({y.data(), d}, s, d, yt.data());
    for (const float alpha : {1.0f, 0.3f}) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, d, alpha, x.data(), d, y.data(), d, 0, blas.data(), s);
      ordered_scores({x.data(), d}, yt.data(), s, d, alpha, mine.data());
      for (int64_t i = 0; i < s; ++i) {
        if (std::memcmp(blas.data() + i * s, mine.data() + i * s, size_t(i + 1) * sizeof(float)) != 0) return false;
      }
    }
  }
  return true;
}

}  // namespace

void ordered_scores(HeadRows x, const float* yt, int64_t s, int64_t d, float alpha, float* out) {
  kHeadScores[size_t(d - 1)](x.data, x.stride, yt, s, alpha, out);
}

bool ordered_products_match(int64_t s, int64_t d) {
  struct Known {
    int64_t s, d;
    bool match;
  };
  static std::mutex mutex;
  static std::vector<Known> known;
  const std::lock_guard lock(mutex);
  const auto it = std::find_if(known.begin(), known.end(), [&](const Known& k) { return k.s == s && k.d == d; });
  if (it != known.end()) return it->match;
  known.push_back({s, d, measure_match(s, d)});
  return known.back().match;
}

}  // namespace emu::cpu
