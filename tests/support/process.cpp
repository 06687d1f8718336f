#include "tests/support/process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace emu::testing {
namespace {
std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}
}  // namespace

ProcessResult run_process(const std::string& command, int timeout_seconds) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("emu-test-" + std::to_string(getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  const std::string full = "timeout -k 5 " + std::to_string(timeout_seconds) + " " + command + " >" +
                           (dir / "out").string() + " 2>" + (dir / "err").string() + " </dev/null";
  const int status = std::system(full.c_str());
  ProcessResult result;
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.exit_code = 128 + WTERMSIG(status);
  result.out = slurp(dir / "out");
  result.err = slurp(dir / "err");
  std::filesystem::remove_all(dir);
  return result;
}

std::string mpiexec(int ranks, bool grace) {
  return std::string("env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 ") +
         "OMPI_MCA_odls_base_sigkill_timeout=" + (grace ? "1 " : "0 ") + EMU_MPIEXEC + " --oversubscribe -n " +
         std::to_string(ranks) + " ";
}

TempDir::TempDir(const std::string& label)
    : path_(std::filesystem::temp_directory_path() /
            ("emu-" + label + "-" + std::to_string(getpid()) + "-" + std::to_string(std::rand()))) {
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() { std::filesystem::remove_all(path_); }

int count_of(const std::string& haystack, const std::string& needle) {
  int count = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + needle.size())) {
    ++count;
  }
  return count;
}

}  // namespace emu::testing
