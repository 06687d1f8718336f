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

// mpiexec with the flags tests need here (oversubscription; root is allowed through the environment).
std::string mpiexec(int ranks);

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
