// The watchdog and the checking mode, on a real job: coll_watchdog_probe runs under mpiexec with 3 ranks and
// misbehaves; the job must end within seconds with exit code 3 and say which collective each rank is in.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

struct Outcome {
  int exit_code = -1;
  std::string output;
  double seconds = 0;
};

Outcome run_probe(const std::string& mode) {
  const std::string command = std::string(EMU_MPIEXEC) + " -n 3 " + EMU_COLL_PROBE + " " + mode + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  Outcome outcome;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return outcome;
  char chunk[4096];
  size_t got = 0;
  while ((got = fread(chunk, 1, sizeof chunk, pipe)) > 0) outcome.output.append(chunk, got);
  const int status = pclose(pipe);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

TEST(Watchdog, BehavingJobExitsZero) {
  const Outcome outcome = run_probe("ok");
  EXPECT_EQ(outcome.exit_code, 0) << outcome.output;
}

TEST(Watchdog, HangEndsTheJobWithExitCode3AndNamesTheCollective) {
  const Outcome outcome = run_probe("hang");
  EXPECT_EQ(outcome.exit_code, 3) << outcome.output;
  EXPECT_LT(outcome.seconds, 30.0) << "the watchdog fires after 2 s, long before the sleeping rank wakes (60 s)";
  // The two ranks that wait in the all-reduce each say where they are.
  for (const char* rank : {"[r0/3]", "[r1/3]"}) {
    const std::string line = std::string(rank) + " coll: watchdog: all_reduce #2 (phase 'backward reduce, unit 7'";
    EXPECT_NE(outcome.output.find(line), std::string::npos) << "missing: " << line << "\n" << outcome.output;
  }
}

TEST(Watchdog, CheckingModeNamesRanksThatCallDifferentCollectives) {
  const Outcome outcome = run_probe("mismatch");
  EXPECT_EQ(outcome.exit_code, 3) << outcome.output;
  EXPECT_NE(outcome.output.find("disagree on collective #2"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("r0: broadcast #2"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("r1,r2: all_reduce #2"), std::string::npos) << outcome.output;
}

}  // namespace
