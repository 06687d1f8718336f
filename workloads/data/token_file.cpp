#include "workloads/data/token_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "emu/check.h"
#include "workloads/data/random.h"

namespace emu::data {
namespace {

constexpr uint64_t kWindowKey = 0x77696e646f77ull;  // "window"
constexpr int64_t kMaxVocab = int64_t{1} << 31;

std::vector<unsigned char> read_all(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::exists(path, error) && !std::filesystem::is_regular_file(path, error)) {
    throw InputError(fmt::format("token file {}: not a regular file", path.string()));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("token file {}: cannot open: {}", path.string(), std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw InputError(fmt::format("token file {}: cannot determine its size", path.string()));
  in.seekg(0, std::ios::beg);
  std::vector<unsigned char> bytes(static_cast<size_t>(size));
  if (!bytes.empty() && !in.read(reinterpret_cast<char*>(bytes.data()), size)) {
    throw InputError(fmt::format("token file {}: read of {} bytes failed", path.string(), size));
  }
  return bytes;
}

}  // namespace

std::vector<int32_t> read_token_file(const std::filesystem::path& path, TokenWidth width, int64_t vocab) {
  if (vocab < 1 || vocab >= kMaxVocab) {
    throw InputError(fmt::format("token file {}: vocabulary size {} must be in [1, 2^31)", path.string(), vocab));
  }
  const std::vector<unsigned char> bytes = read_all(path);
  const auto w = static_cast<size_t>(width);
  if (bytes.size() % w != 0) {
    throw InputError(
        fmt::format("token file {}: {} bytes is not a whole number of {}-byte tokens ({} bytes left "
                    "over at offset {}); is the token width right?",
                    path.string(), bytes.size(), w, bytes.size() % w, bytes.size() - bytes.size() % w));
  }
  std::vector<int32_t> tokens(bytes.size() / w);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const unsigned char* p = &bytes[i * w];
    uint32_t value = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8;
    if (width == TokenWidth::kU32) value |= static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
    if (value >= static_cast<uint64_t>(vocab)) {
      throw InputError(fmt::format("token file {}: token {} at byte offset {} is {}, not below the vocabulary size {}",
                                   path.string(), i, i * w, value, vocab));
    }
    tokens[i] = static_cast<int32_t>(value);
  }
  return tokens;
}

TokenFile::TokenFile(TokenFileConfig config) : config_(std::move(config)) {
  if (config_.seq_len < 1) {
    throw InputError(
        fmt::format("token file {}: sequence length {} must be >= 1", config_.path.string(), config_.seq_len));
  }
  tokens_ = read_token_file(config_.path, config_.width, config_.vocab);
  if (config_.fold_vocab > 0 && config_.fold_vocab < config_.vocab) {
    for (int32_t& token : tokens_) token %= static_cast<int32_t>(config_.fold_vocab);
  } else if (config_.fold_vocab >= config_.vocab) {
    config_.fold_vocab = 0;  // nothing to fold
  }
  const auto needed = static_cast<uint64_t>(config_.seq_len) + 1;
  if (tokens_.size() < needed) {
    throw InputError(fmt::format("token file {}: {} tokens is too short; one sequence of length {} needs {} tokens",
                                 config_.path.string(), tokens_.size(), config_.seq_len, needed));
  }
}

void TokenFile::sample(int64_t step, int64_t index, std::span<int32_t> tokens, std::span<int32_t> targets) const {
  const auto s = static_cast<size_t>(config_.seq_len);
  EMU_CHECK(step >= 0 && index >= 0, "sample index ({}, {}) must be >= 0", step, index);
  EMU_CHECK(tokens.size() == s && targets.size() == s, "sample needs {} tokens and targets, got {} and {}", s,
            tokens.size(), targets.size());
  SampleRandom random(config_.seed ^ kWindowKey, static_cast<uint64_t>(step), static_cast<uint64_t>(index));
  const size_t start = random.below(tokens_.size() - s);
  std::copy_n(tokens_.begin() + static_cast<std::ptrdiff_t>(start), s, tokens.begin());
  std::copy_n(tokens_.begin() + static_cast<std::ptrdiff_t>(start + 1), s, targets.begin());
}

}  // namespace emu::data
