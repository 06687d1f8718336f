// Fuzzes the token file reader (workloads/data/token_file.h). The first 6 bytes of an input are the reader's
// other arguments, the rest is the file:
//   byte 0      bit 0: token width (0 = uint16, 1 = uint32); bit 1: add 2^31 to V (to reach the 2^31 limit)
//   bytes 1-4   vocabulary size V, signed 32-bit little-endian (so zero and negative sizes are tried too)
//   byte 5      sequence length s - 1, for TokenFile, which also needs s + 1 tokens and samples windows
//   bytes 6-    the token file's contents
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tests/fuzz/fuzz_support.h"
#include "workloads/data/token_file.h"

namespace {
constexpr size_t kArgumentBytes = 6;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static emu::fuzz::ScratchFile scratch("tokens.bin");
  if (size < kArgumentBytes) return 0;
  const auto width = (data[0] & 1) != 0 ? emu::data::TokenWidth::kU32 : emu::data::TokenWidth::kU16;
  const auto raw_vocab =
      static_cast<int32_t>(static_cast<uint32_t>(data[1]) | static_cast<uint32_t>(data[2]) << 8 |
                           static_cast<uint32_t>(data[3]) << 16 | static_cast<uint32_t>(data[4]) << 24);
  const int64_t vocab = raw_vocab + ((data[0] & 2) != 0 ? int64_t{1} << 31 : 0);
  const int64_t seq_len = int64_t{data[5]} + 1;
  const auto& path = scratch.write(data + kArgumentBytes, size - kArgumentBytes);

  bool accepted = false;
  emu::fuzz::expect_accept_or_input_error("emu::data::read_token_file", [&] {
    const std::vector<int32_t> tokens = emu::data::read_token_file(path, width, vocab);
    for (const int32_t token : tokens) {
      if (token < 0 || token >= vocab) emu::fuzz::finding("an accepted token is outside [0, V)");
    }
    accepted = true;
  });
  // TokenFile reads the file the same way, so it is only worth trying on a file the reader accepted.
  if (!accepted) return 0;
  emu::fuzz::expect_accept_or_input_error("emu::data::TokenFile", [&] {
    const emu::data::TokenFile file({.path = path, .width = width, .vocab = vocab, .seq_len = seq_len, .seed = 1});
    std::vector<int32_t> window(static_cast<size_t>(seq_len));
    std::vector<int32_t> targets(static_cast<size_t>(seq_len));
    for (int64_t index = 0; index < 2; ++index) file.sample(0, index, window, targets);
  });
  return 0;
}
