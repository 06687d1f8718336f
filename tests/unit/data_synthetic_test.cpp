// The synthetic token stream: deterministic in (seed, step, sample), the same samples however a global batch is
// split over ranks and micro-batches, and structured enough that the next token is far from uniform.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "emu/check.h"
#include "workloads/data/synthetic.h"

namespace emu::data {
namespace {

SyntheticConfig small_config(uint64_t seed = 42) {
  SyntheticConfig config;
  config.seed = seed;
  config.vocab = 64;
  config.seq_len = 32;
  return config;
}

TEST(SyntheticTokens, SameSeedSameTokensDifferentSeedOrStepDifferent) {
  const SyntheticTokens a(small_config()), b(small_config()), other(small_config(43));
  const Batch first = a.batch(3, 0, 4);
  EXPECT_EQ(first.tokens, b.batch(3, 0, 4).tokens);
  EXPECT_EQ(first.targets, b.batch(3, 0, 4).targets);
  EXPECT_NE(first.tokens, other.batch(3, 0, 4).tokens);
  EXPECT_NE(first.tokens, a.batch(4, 0, 4).tokens);
  // Any sample can be made on its own, in any order.
  const Batch one = a.batch(3, 2, 1);
  EXPECT_TRUE(std::equal(one.tokens.begin(), one.tokens.end(), first.tokens.begin() + 2 * 32));
}

TEST(SyntheticTokens, TargetsAreTheNextTokensAndInRange) {
  const SyntheticTokens source(small_config());
  const Batch batch = source.batch(0, 0, 8);
  ASSERT_EQ(batch.tokens.size(), 8u * 32);
  for (int64_t row = 0; row < 8; ++row) {
    for (int64_t j = 0; j + 1 < 32; ++j) {
      EXPECT_EQ(batch.targets[static_cast<size_t>(row * 32 + j)], batch.tokens[static_cast<size_t>(row * 32 + j + 1)]);
    }
  }
  for (size_t i = 0; i < batch.tokens.size(); ++i) {
    EXPECT_GE(batch.tokens[i], 0);
    EXPECT_LT(batch.tokens[i], 64);
    EXPECT_GE(batch.targets[i], 0);
    EXPECT_LT(batch.targets[i], 64);
  }
}

TEST(SyntheticTokens, RanksAndMicroBatchesSeeTheSingleRankSamples) {
  const SyntheticTokens source(small_config());
  const int world = 4;
  const int64_t b = 2;
  const int64_t micro_batches = 3;
  const size_t row = 32;
  for (int64_t step = 0; step < 2; ++step) {
    for (int64_t m = 0; m < micro_batches; ++m) {
      // Single-rank training takes micro-batch m of size world·b.
      const Batch whole = source.batch(step, sample_offset(0, 1, m, world * b), world * b);
      for (int rank = 0; rank < world; ++rank) {
        const Batch part = source.batch(step, sample_offset(rank, world, m, b), b);
        const auto begin = whole.tokens.begin() + static_cast<std::ptrdiff_t>(rank * b * row);
        EXPECT_TRUE(std::equal(part.tokens.begin(), part.tokens.end(), begin)) << "rank " << rank << " micro " << m;
        const auto target_begin = whole.targets.begin() + static_cast<std::ptrdiff_t>(rank * b * row);
        EXPECT_TRUE(std::equal(part.targets.begin(), part.targets.end(), target_begin));
      }
    }
  }
}

TEST(SyntheticTokens, ChainRowsAreDistributionsWithTheStatedEntropy) {
  const SyntheticTokens source(small_config());
  for (int32_t token : {0, 17, 63}) {
    double total = 0;
    for (int32_t next = 0; next < 64; ++next) total += source.transition_probability(token, next);
    EXPECT_NEAR(total, 1.0, 1e-12);
    EXPECT_EQ(source.successors(token).size(), 4u);
  }
  EXPECT_LT(source.entropy_rate(), 0.5 * std::log(64.0));
  SyntheticConfig defaults;
  defaults.vocab = 512;
  defaults.seq_len = 8;
  EXPECT_NEAR(SyntheticTokens(defaults).entropy_rate(), 1.6, 0.1) << "the figure synthetic.h quotes";
}

TEST(SyntheticTokens, EmpiricalConditionalEntropyIsFarBelowUniform) {
  // Plug-in estimate of H(next | current) from 20 480 transitions; a uniform stream would give ln 64 ≈ 4.16.
  const SyntheticTokens source(small_config());
  const Batch batch = source.batch(0, 0, 640);
  std::map<int32_t, std::map<int32_t, double>> counts;
  for (size_t i = 0; i < batch.tokens.size(); ++i) counts[batch.tokens[i]][batch.targets[i]] += 1;
  double entropy = 0;
  const auto n = static_cast<double>(batch.tokens.size());
  for (const auto& [token, row] : counts) {
    double row_total = 0;
    for (const auto& [next, count] : row) row_total += count;
    for (const auto& [next, count] : row) entropy -= count / n * std::log(count / row_total);
  }
  EXPECT_LT(entropy, 0.5 * std::log(64.0));
  EXPECT_NEAR(entropy, source.entropy_rate(), 0.15);
}

TEST(SyntheticTokens, BadConfigurationsAreBadInput) {
  SyntheticConfig config = small_config();
  config.vocab = 1;
  EXPECT_THROW(SyntheticTokens{config}, InputError);
  config = small_config();
  config.seq_len = 0;
  EXPECT_THROW(SyntheticTokens{config}, InputError);
  config = small_config();
  config.successors = 65;
  EXPECT_THROW(SyntheticTokens{config}, InputError);
  config = small_config();
  config.noise = 1.5;
  EXPECT_THROW(SyntheticTokens{config}, InputError);
  config = small_config();
  config.vocab = 3;
  config.successors = 3;  // every token a successor: still a valid chain
  EXPECT_NO_THROW(SyntheticTokens{config});
}

}  // namespace
}  // namespace emu::data
