// The exit code of a GoogleTest executable as ctest reads it: 0 passed, 1 failed, kSkipExitCode when nothing
// failed and at least one case skipped (registered with SKIP_RETURN_CODE, cmake/EmuTesting.cmake), so a skipped
// case shows as skipped rather than passed. A run that selects no case at all (a --gtest_filter naming a case
// that was renamed) fails, so a registration can never drop its cases silently.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

namespace emu::testing {

inline constexpr int kSkipExitCode = 77;

// From the counts of one executable (summed over ranks by the MPI main).
inline int test_exit_code(int failed, int skipped, int selected) {
  if (selected == 0) {
    std::fprintf(stderr, "no test case matches the filter '%s': a case was renamed or removed\n",
                 GTEST_FLAG_GET(filter).c_str());
    return 1;
  }
  if (failed > 0) return 1;
  return skipped > 0 ? kSkipExitCode : 0;
}

}  // namespace emu::testing
