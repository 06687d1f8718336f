// The test mains' exit codes, which ctest reads (SKIP_RETURN_CODE 77): a case that skips makes the executable
// skipped, never passed; a failure beside a skip still fails; a filter that selects nothing fails. Checked on
// tests/support/exit_probe.cpp built with the unit main and with the MPI main (at 1 and 3 ranks).
#include <gtest/gtest.h>

#include <string>

#include "tests/support/process.h"
#include "tests/support/test_exit.h"

namespace emu::testing {
namespace {

struct Expected {
  const char* filter;
  int code;
};

constexpr Expected kCases[] = {
    {"Probe.Passes", 0},
    {"Probe.Skips", kSkipExitCode},
    {"Probe.Passes:Probe.Skips", kSkipExitCode},
    {"Probe.Skips:Probe.Fails", 1},
    {"Probe.Fails", 1},
    {"Probe.NoSuchCase", 1},
};

void expect_codes(const std::string& launcher, const std::string& probe) {
  for (const Expected& c : kCases) {
    const ProcessResult result = run_process(launcher + probe + " --gtest_filter=" + c.filter);
    EXPECT_EQ(result.exit_code, c.code) << launcher << probe << " --gtest_filter=" << c.filter << "\n"
                                        << result.out << result.err;
  }
}

TEST(TestExit, UnitMainExitsSkippedFailedOrPassed) { expect_codes("", EMU_EXIT_PROBE_UNIT); }

TEST(TestExit, MpiMainAgreesOnTheExitCodeOverRanks) {
  for (int ranks : {1, 3}) expect_codes(mpiexec(ranks), EMU_EXIT_PROBE_MPI);
}

}  // namespace
}  // namespace emu::testing
