// Runs a command line in a child process and captures what it printed and how it ended; for end-to-end tests
// that start emu under mpiexec and check exit codes and messages.
#pragma once

#include <filesystem>
#include <string>

namespace emu::testing {

struct ProcessResult {
  int exit_code = -1;  // the exit status, or 128 + signal number
  std::string out;
  std::string err;
};

// Runs `command` through /bin/sh, with a hard time limit so that no test waits on a hang.
ProcessResult run_process(const std::string& command, int timeout_seconds = 60);

// mpiexec with the flags tests need here (oversubscription; root is allowed through the environment). Open MPI's
// launcher, once a rank exits non-zero, kills the job's other ranks with SIGTERM and waits odls_base_sigkill_timeout
// (1 s) before SIGKILL, even when every rank has exited already: a bad input's exit 2 took 2.2 s at 2 ranks, 0.16
// s with no wait. Tests run with none, so that their tables of bad inputs (hundreds of jobs) run in seconds;
// `grace` sets the launcher's default (the tests' environment has none), for a test of what a rank does between
// SIGTERM and SIGKILL. The point-to-point layer is named, ob1, as scripts/mpirun names it: the one Open MPI picks on
// one machine anyway, but picked without probing the network libraries, 0.2 s of every job's start (0.34 → 0.13 s at
// 2 ranks).
std::string mpiexec(int ranks, bool grace = false);

// A fresh folder under the system's temporary folder, removed with everything in it at the end of the scope.
class TempDir {
 public:
  explicit TempDir(const std::string& label);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Counts non-overlapping occurrences of `needle` in `haystack`.
int count_of(const std::string& haystack, const std::string& needle);

}  // namespace emu::testing
