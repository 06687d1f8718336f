// The emu command line: what a run was asked to do, validated once at start-up on every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "emu/cap_spec.h"

namespace emu::app {

struct RunOptions {
  CapSpec cap = parse_cap_spec("none");
  int shrink = 64;                   // k: hidden, FFN, vocabulary and sequence are divided by it
  uint64_t reserve_full_scale = 0;   // fixed overheads at full scale; the rank is charged reserve / k^2
  std::string reserve_text = "1GiB";
  bool strict_oom = false;
  std::string log_spec;
};

// What parse_command_line decided.
struct ParsedCommandLine {
  enum class Action { kRun, kPrintAndExit } action = Action::kRun;
  std::string text_to_print;  // --help / --version output, printed by rank 0
  RunOptions options;
};

// Throws InputError (exit code 2) naming the bad value and the accepted range.
ParsedCommandLine parse_command_line(int argc, const char* const* argv);

}  // namespace emu::app
