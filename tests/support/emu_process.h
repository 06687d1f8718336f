// What the end-to-end tests of the emu executable share: its path in this build, a quick model to run, and reading
// the JSON it writes. Header-only: EMU_BINARY_DIR comes from the test target (cmake/EmuTesting.cmake).
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/process.h"

namespace emu::testing {

inline const std::string kEmu = std::string(EMU_BINARY_DIR) + "/bin/emu";
// GPT-2 (124M) shrunk by 8: 1.9M parameters, quick on 8 oversubscribed ranks.
inline const std::string kSmall = " --model gpt2 --shrink 8 --steps 2";

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace emu::testing
