// A test executable with one case of each outcome, for test_exit_test: which cases run is chosen by --gtest_filter;
// linked once with the unit main and once with the MPI main. Not registered with ctest itself.
#include <gtest/gtest.h>

TEST(Probe, Passes) { SUCCEED(); }
TEST(Probe, Skips) { GTEST_SKIP() << "skipped on purpose"; }
TEST(Probe, Fails) { FAIL() << "failed on purpose"; }
