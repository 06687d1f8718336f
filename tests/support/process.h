// Runs a command line in a child process and captures what it printed and how it ended; for end-to-end tests
// that start emu under mpiexec and check exit codes and messages.
#pragma once

#include <string>

namespace emu::testing {

struct ProcessResult {
  int exit_code = -1;  // the exit status, or 128 + signal number
  std::string out;
  std::string err;
};

// Runs `command` through /bin/sh, with a hard time limit so that no test waits on a hang.
ProcessResult run_process(const std::string& command, int timeout_seconds = 60);

// mpiexec with the flags tests need here (oversubscription; root is allowed through the environment).
std::string mpiexec(int ranks);

// Counts non-overlapping occurrences of `needle` in `haystack`.
int count_of(const std::string& haystack, const std::string& needle);

}  // namespace emu::testing
