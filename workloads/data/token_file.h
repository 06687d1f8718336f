// Training tokens from a file of raw little-endian uint16 or uint32 token ids (as llm.c and nanoGPT write them,
// without a header).
//
// The whole file is read and checked once at start-up: its size must be a whole number of tokens, it must hold
// at least one sequence (s + 1 tokens), and every token must be below the vocabulary size; an InputError names
// the file and, for a bad token, its byte offset and value. Sample `index` of step `step` is the window of s + 1
// consecutive tokens starting at a position drawn from (seed, step, index), uniformly over the n − s possible
// starts, so samples are independent of how a global batch is split over ranks. A shrunk model has a smaller
// vocabulary than the tokenizer that wrote the file: fold_vocab maps every id into it (id mod V'), which keeps the
// stream's structure (the same id is always the same token) while distinct ids may share a token.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "workloads/data/token_source.h"

namespace emu::data {

enum class TokenWidth : uint8_t { kU16 = 2, kU32 = 4 };

struct TokenFileConfig {
  std::filesystem::path path;
  TokenWidth width = TokenWidth::kU16;
  int64_t vocab = 0;    // V: every token must be < V
  int64_t seq_len = 0;  // s ≥ 1
  uint64_t seed = 1234;
  int64_t fold_vocab = 0;  // V' < V: ids are folded into a smaller vocabulary (a shrunk model's) as id mod V'; 0: none
};

// Reads and checks every token of `path` (see above); InputError on any problem.
std::vector<int32_t> read_token_file(const std::filesystem::path& path, TokenWidth width, int64_t vocab);

class TokenFile final : public TokenSource {
 public:
  // Reads and checks the file; InputError if it is unreadable, malformed, or shorter than s + 1 tokens.
  explicit TokenFile(TokenFileConfig config);

  int64_t vocab() const override { return config_.fold_vocab > 0 ? config_.fold_vocab : config_.vocab; }
  int64_t seq_len() const override { return config_.seq_len; }
  void sample(int64_t step, int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const override;

  size_t token_count() const { return tokens_.size(); }
  std::span<const int32_t> tokens() const { return tokens_; }

 private:
  TokenFileConfig config_;
  std::vector<int32_t> tokens_;
};

}  // namespace emu::data
