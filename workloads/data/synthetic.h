// A seeded synthetic token stream with structure a small model learns within tens of steps.
//
// Tokens follow a fixed sparse Markov chain drawn from the seed: every token a has `successors` distinct
// successor tokens, the k-th taken with weight 2^-k (normalised), and with probability `noise` the next token is
// uniform over the vocabulary instead. A sequence starts at a uniform token. Every row of the chain has the same
// entropy, so the chain's entropy rate, the lowest loss any model can reach, is entropy_rate(); with the defaults
// it is about 1.6 nats for V = 512, against ln V ≈ 6.2 for a model that knows nothing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "workloads/data/token_source.h"

namespace emu::data {

struct SyntheticConfig {
  uint64_t seed = 1234;
  int64_t vocab = 0;    // V ≥ 2
  int64_t seq_len = 0;  // s ≥ 1
  int successors = 4;   // distinct successors per token, 1 … min(V, 64)
  double noise = 0.05;  // probability of a uniform next token, in [0, 1]

  // InputError naming the bad value and the accepted range.
  void validate() const;
};

class SyntheticTokens final : public TokenSource {
 public:
  explicit SyntheticTokens(SyntheticConfig config);

  int64_t vocab() const override { return config_.vocab; }
  int64_t seq_len() const override { return config_.seq_len; }
  void sample(int64_t step, int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const override;

  const SyntheticConfig& config() const { return config_; }
  // The successors of `token` in weight order, heaviest first.
  std::span<const int32_t> successors(int32_t token) const;
  // Probability that `next` follows `token`.
  double transition_probability(int32_t token, int32_t next) const;
  // Entropy of one row of the chain in nats: the loss of a model that has learnt the chain exactly.
  double entropy_rate() const;

 private:
  int32_t next_token(int32_t token, double u, uint64_t uniform_pick) const;

  SyntheticConfig config_;
  std::vector<int32_t> successors_;  // [V, successors]
  std::vector<double> cumulative_;   // [successors]: P(pick ≤ k | not noise)
};

}  // namespace emu::data
