#include "workloads/data/synthetic.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "emu/check.h"
#include "workloads/data/random.h"

namespace emu::data {
namespace {

// Keys that keep the chain's stream apart from the samples' streams.
constexpr uint64_t kChainKey = 0x636861696eull;     // "chain"
constexpr uint64_t kSampleKey = 0x73616d706c65ull;  // "sample"
constexpr int kMaxSuccessors = 64;
constexpr int64_t kMaxVocab = int64_t{1} << 31;

}  // namespace

void SyntheticConfig::validate() const {
  if (vocab < 2 || vocab >= kMaxVocab) {
    throw InputError(fmt::format("synthetic data: vocabulary size {} must be in [2, 2^31)", vocab));
  }
  if (seq_len < 1) throw InputError(fmt::format("synthetic data: sequence length {} must be >= 1", seq_len));
  if (successors < 1 || successors > kMaxSuccessors || successors > vocab) {
    throw InputError(fmt::format("synthetic data: {} successors per token must be in [1, min(V = {}, {})]", successors,
                                 vocab, kMaxSuccessors));
  }
  if (!(noise >= 0 && noise <= 1)) throw InputError(fmt::format("synthetic data: noise {} must be in [0, 1]", noise));
}

SyntheticTokens::SyntheticTokens(SyntheticConfig config) : config_(config) {
  config_.validate();
  const auto k = static_cast<size_t>(config_.successors);
  const auto v = static_cast<size_t>(config_.vocab);

  // Weights 2^-j for j = 0 … k−1, normalised, as a cumulative distribution.
  double total = 0;
  for (size_t j = 0; j < k; ++j) total += std::ldexp(1.0, -static_cast<int>(j));
  cumulative_.resize(k);
  double running = 0;
  for (size_t j = 0; j < k; ++j) {
    running += std::ldexp(1.0, -static_cast<int>(j)) / total;
    cumulative_[j] = running;
  }
  cumulative_[k - 1] = 1.0;

  // k distinct successors per token, by rejection (k is small against V, or V is small).
  successors_.resize(v * k);
  SampleRandom random(config_.seed, kChainKey);
  for (size_t token = 0; token < v; ++token) {
    int32_t* row = &successors_[token * k];
    for (size_t j = 0; j < k; ++j) {
      int32_t candidate;
      do {
        candidate = static_cast<int32_t>(random.below(v));
      } while (std::find(row, row + j, candidate) != row + j);
      row[j] = candidate;
    }
  }
}

std::span<const int32_t> SyntheticTokens::successors(int32_t token) const {
  EMU_CHECK(token >= 0 && token < config_.vocab, "token {} outside [0, {})", token, config_.vocab);
  const auto k = static_cast<size_t>(config_.successors);
  return {&successors_[static_cast<size_t>(token) * k], k};
}

double SyntheticTokens::transition_probability(int32_t token, int32_t next) const {
  double p = config_.noise / static_cast<double>(config_.vocab);
  const std::span<const int32_t> row = successors(token);
  for (size_t j = 0; j < row.size(); ++j) {
    if (row[j] == next) p += (1 - config_.noise) * (cumulative_[j] - (j == 0 ? 0.0 : cumulative_[j - 1]));
  }
  return p;
}

double SyntheticTokens::entropy_rate() const {
  // Every row is the same mixture up to relabelling: k successor probabilities and V − k noise-only ones.
  const double uniform = config_.noise / static_cast<double>(config_.vocab);
  auto term = [](double p) { return p > 0 ? -p * std::log(p) : 0.0; };
  double entropy = static_cast<double>(config_.vocab - config_.successors) * term(uniform);
  for (size_t j = 0; j < cumulative_.size(); ++j) {
    const double weight = cumulative_[j] - (j == 0 ? 0.0 : cumulative_[j - 1]);
    entropy += term((1 - config_.noise) * weight + uniform);
  }
  return entropy;
}

int32_t SyntheticTokens::next_token(int32_t token, double u, uint64_t uniform_pick) const {
  if (u < config_.noise) return static_cast<int32_t>(uniform_pick);
  const double within = (u - config_.noise) / (1 - config_.noise);
  const auto j =
      static_cast<size_t>(std::upper_bound(cumulative_.begin(), cumulative_.end(), within) - cumulative_.begin());
  return successors(token)[std::min(j, cumulative_.size() - 1)];
}

void SyntheticTokens::sample(int64_t step, int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const {
  const auto s = static_cast<size_t>(config_.seq_len);
  EMU_CHECK(step >= 0 && index >= 0, "sample index ({}, {}) must be >= 0", step, index);
  EMU_CHECK(tokens.size() == s && targets.size() == s, "sample needs {} tokens and targets, got {} and {}", s,
            tokens.size(), targets.size());
  SampleRandom random(config_.seed ^ kSampleKey, static_cast<uint64_t>(step), static_cast<uint64_t>(index));
  const auto v = static_cast<uint64_t>(config_.vocab);
  int32_t current = static_cast<int32_t>(random.below(v));
  for (size_t i = 0; i < s; ++i) {
    tokens[i] = current;
    const double u = random.unit();
    const uint64_t pick = random.below(v);
    current = next_token(current, u, pick);
    targets[i] = current;
  }
}

}  // namespace emu::data
