// The attention head's score products written out (emu/cpu/ordered_products.h): each score is the d products of
// its row and key summed in order, one fused multiply-add each, then scaled, as OpenBLAS's sgemm rounds them; only
// the causal part of each row is written; and where the probe says so, they agree with sgemm bit for bit.
#include <cblas.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "emu/cpu/ordered_products.h"

namespace emu::cpu {
namespace {

std::vector<float> seeded(size_t n, uint32_t seed) {
  std::vector<float> values(n);
  for (float& value : values) {
    seed = seed * 22695477u + 1u;
    value = static_cast<float>(seed >> 9) * 0x1p-21f - 2.0f;  // [−2, 2)
  }
  return values;
}

// Row 0 · key 0 = 1·(−1) + (1 + 2⁻¹²)²: the second product is 1 + 2⁻¹¹ + 2⁻²⁴ exactly, half an ulp past a float.
// Summed in order and fused, −1 + that is exact: 2⁻¹¹ + 2⁻²⁴. Rounded before the sum (unfused), or taken first
// (its rounding to 1 + 2⁻¹¹ then kept), it is 2⁻¹¹.
TEST(OrderedScores, SumsTheProductsInOrderEachFused) {
  const float w = 1.0f + 0x1p-12f;
  const std::vector<float> x = {1.0f, w}, y = {-1.0f, w};  // [1, 2] each
  std::vector<float> yt(2);
  transpose_head({y.data(), 2}, 1, 2, yt.data());
  float out = 0;
  ordered_scores({x.data(), 2}, yt.data(), 1, 2, 1.0f, &out);
  EXPECT_EQ(out, 0x1p-11f + 0x1p-24f);
  ordered_scores({x.data(), 2}, yt.data(), 1, 2, 0.5f, &out);  // the scale after the sum: exact halving
  EXPECT_EQ(out, 0x1p-12f + 0x1p-25f);
}

TEST(OrderedScores, WritesOnlyTheCausalPartOfEachRow) {
  constexpr int64_t s = 9, d = 3;
  const std::vector<float> x = seeded(s * d, 1), y = seeded(s * d, 2);
  std::vector<float> yt(s * d), out(s * s, std::numeric_limits<float>::quiet_NaN());
  transpose_head({y.data(), d}, s, d, yt.data());
  ordered_scores({x.data(), d}, yt.data(), s, d, 0.25f, out.data());
  for (int64_t i = 0; i < s; ++i) {
    for (int64_t j = 0; j < s; ++j) EXPECT_EQ(std::isnan(out[i * s + j]), j > i) << "row " << i << ", key " << j;
  }
}

// Every shape the ordered loops take, against this machine's sgemm, on values other than the probe's. A shape whose
// probe finds sgemm rounding otherwise keeps sgemm in attention, so there is nothing to compare for it: a BLAS
// without fused multiply-adds disagrees everywhere, and OpenBLAS's Haswell kernels on an AMD EPYC round d = 8 and
// 16 otherwise from 64 positions on. Where the probe says they agree, they must agree on these values too.
TEST(OrderedScores, AgreeWithSgemmBitForBitWhereTheProbeSaysSo) {
  int compared = 0;
  for (const int64_t d : {1, 2, 3, 5, 8, 16}) {
    for (const int64_t s : {1, 7, 64, 200}) {
      if (!ordered_products_match(s, d)) continue;
      ++compared;
      const std::vector<float> x = seeded(size_t(s * d), 3), y = seeded(size_t(s * d), 4);
      std::vector<float> yt(size_t(s * d)), blas(size_t(s * s)), mine(size_t(s * s));
      transpose_head({y.data(), d}, s, d, yt.data());
      for (const float alpha : {1.0f, 0.3f}) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s, s, d, alpha, x.data(), d, y.data(), d, 0, blas.data(),
                    s);
        ordered_scores({x.data(), d}, yt.data(), s, d, alpha, mine.data());
        for (int64_t i = 0; i < s; ++i) {
          for (int64_t j = 0; j <= i; ++j) {
            ASSERT_EQ(std::bit_cast<uint32_t>(mine[i * s + j]), std::bit_cast<uint32_t>(blas[i * s + j]))
                << "s " << s << ", d " << d << ", alpha " << alpha << ", row " << i << ", key " << j;
          }
        }
      }
    }
  }
  if (compared == 0) GTEST_SKIP() << "this machine's sgemm rounds otherwise for every shape; attention keeps sgemm";
  std::printf("%d of 24 shapes agree with this machine's sgemm and were compared\n", compared);
}

}  // namespace
}  // namespace emu::cpu
