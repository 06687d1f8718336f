// GoogleTest main for MPI tests: every rank runs every test; a failure on any rank fails the test and the
// executable; rank 0 prints the usual report, the other ranks print only their own failures, tagged "[rR/N]".
// The exit code, agreed by all ranks, is test_exit.h's: 77 (ctest: skipped) when no rank failed and some skipped.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>

#include "emu/check.h"
#include "tests/support/test_exit.h"

namespace {

// Other ranks: print each failed assertion once, with the rank, since their result printer is silenced.
class RankFailurePrinter : public testing::EmptyTestEventListener {
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "%s %s:%d: failure\n%s\n", emu::rank_tag().c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.summary());
    std::fflush(stderr);
  }
};

// All ranks: agree at the end of each test whether any rank failed; rank 0 names the ranks that did.
class RankAgreement : public testing::EmptyTestEventListener {
  void OnTestEnd(const testing::TestInfo& info) override {
    int rank = 0;
    int world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const int failed = info.result()->Failed() ? 1 : 0;
    std::string flags(static_cast<size_t>(world), '\0');
    char mine = static_cast<char>(failed);
    MPI_Gather(&mine, 1, MPI_CHAR, flags.data(), 1, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank != 0) return;
    std::string failing;
    for (int r = 0; r < world; ++r) {
      if (flags[static_cast<size_t>(r)] != 0) failing += (failing.empty() ? "" : ", ") + std::to_string(r);
    }
    if (!failing.empty()) {
      std::fprintf(stdout, "[  RANKS   ] %s.%s failed on rank(s) %s of %d\n", info.test_suite_name(), info.name(),
                   failing.c_str(), world);
      std::fflush(stdout);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  MPI_Init(&argc, &argv);
  int rank = 0;
  int world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  emu::set_rank_context(rank, world);

  testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter);
  }
  listeners.Append(new RankAgreement);

  const int result = RUN_ALL_TESTS();
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  // Over all ranks: did any fail, did any skip, did any select a case.
  int counts[3] = {result != 0 || unit.failed_test_count() > 0 ? 1 : 0, unit.skipped_test_count(),
                   unit.test_to_run_count()};
  MPI_Allreduce(MPI_IN_PLACE, counts, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  const int code = emu::testing::test_exit_code(counts[0], counts[1], counts[2]);
  if (rank == 0 && code == emu::testing::kSkipExitCode) {
    std::fprintf(stdout, "[ SKIPPED  ] exit %d: no case failed on any of %d rank(s), %d skipped\n", code, world,
                 counts[1]);
  }
  return code;
}
