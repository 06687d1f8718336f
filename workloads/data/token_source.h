// Where training tokens come from: a seeded synthetic stream or a token file, behind one interface.
//
// Every sample is a pure function of (seed, step, sample index), so data parallelism cannot change what is
// trained on: a global step of A micro-batches on N ranks with micro-batch size b has A·N·b samples, and
// micro-batch m of rank r holds samples (m·N + r)·b … (m·N + r)·b + b − 1 (sample_offset). Single-rank training
// with micro-batch N·b takes samples m·N·b … (m+1)·N·b − 1 as its micro-batch m: the same samples, so the same
// averaged gradient.
//
// Token data lives on the host and is not charged to the device; a model copies a batch into device memory.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace emu::data {

// b sequences of s tokens, row-major [b, s]: targets[i·s + j] is the token that follows tokens[i·s + j].
struct Batch {
  int64_t batch = 0;    // b
  int64_t seq_len = 0;  // s
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
};

// Index of the first sample that micro-batch `micro_batch` of `rank` (of `world` data-parallel ranks) holds
// within its global step, for micro-batch size `batch`.
constexpr int64_t sample_offset(int rank, int world, int64_t micro_batch, int64_t batch) {
  return (micro_batch * world + rank) * batch;
}

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int64_t vocab() const = 0;    // every token is in [0, vocab)
  virtual int64_t seq_len() const = 0;  // s

  // Sample `index` of global step `step` (both ≥ 0): s input tokens and the s tokens that follow each of them.
  // The same arguments give the same tokens in every process.
  virtual void sample(int64_t step, int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const = 0;

  // Samples first … first + batch − 1 of `step`, as a [batch, s] batch.
  Batch batch(int64_t step, int64_t first, int64_t batch) const;
};

}  // namespace emu::data
