// GoogleTest main for unit tests: GoogleTest's own, except that a run where nothing failed and some case skipped
// exits with kSkipExitCode (ctest: skipped), and a run that selects no case fails (test_exit.h).
#include <gtest/gtest.h>

#include "tests/support/test_exit.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  const int failed = result != 0 || unit.failed_test_count() > 0 ? 1 : 0;
  return emu::testing::test_exit_code(failed, unit.skipped_test_count(), unit.test_to_run_count());
}
