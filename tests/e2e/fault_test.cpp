// Injected faults end to end: a straggler changes times, not results; a killed rank ends the whole job within
// seconds, named, with no output file left; a hang is caught by the watchdog and a mismatched collective by the
// call checks, both with exit code 3 and every waiting rank saying where it is. No test here relies on ctest's
// timeout: run_process has its own limit, and each case must finish well inside it.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/emu_process.h"

namespace emu {
namespace {

using nlohmann::json;
using testing::count_of;
using testing::mpiexec;
using testing::run_process;

using testing::kEmu;
using testing::kSmall;
using testing::read_json;

double seconds_of(const std::function<void()>& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(Fault, StragglerChangesTimesNotResults) {
  testing::TempDir dir("fault");
  const std::string plain = dir.file("plain.json"), slow = dir.file("slow.json");
  const std::string run = mpiexec(4) + kEmu + kSmall + " --strategies ddp,zero3 --json ";
  ASSERT_EQ(run_process(run + plain).exit_code, 0);
  const auto straggler = run_process(run + slow + " --fault delay:2:0.4");
  ASSERT_EQ(straggler.exit_code, 0) << straggler.err;
  const json a = read_json(plain), b = read_json(slow);
  for (size_t s = 0; s < a["strategies"].size(); ++s) {
    EXPECT_EQ(a["strategies"][s]["losses"], b["strategies"][s]["losses"]) << "bit-identical losses";
    EXPECT_EQ(a["strategies"][s]["peak_bytes_per_rank"], b["strategies"][s]["peak_bytes_per_rank"]);
    EXPECT_EQ(a["strategies"][s]["traffic_per_step"], b["strategies"][s]["traffic_per_step"]);
  }
}

TEST(Fault, KilledRankEndsTheJobPromptlyAndLeavesNoFile) {
  testing::TempDir dir("fault");
  const std::string out = dir.file("killed.json"), trace = dir.file("killed.trace.json");
  testing::ProcessResult run;
  const double seconds = seconds_of([&] {
    run = run_process(
        mpiexec(4) + kEmu + kSmall + " --strategies ddp,zero3 --fault kill:2:2 --json " + out + " --trace " + trace,
        60);
  });
  EXPECT_NE(run.exit_code, 0);
  EXPECT_LT(seconds, 30.0);
  EXPECT_NE(run.err.find("[r2/4] emu: fault injection: killing rank 2 at step 2"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("rank 2"), std::string::npos) << run.err;
  EXPECT_FALSE(std::filesystem::exists(out)) << "complete or absent";
  EXPECT_FALSE(std::filesystem::exists(trace)) << "complete or absent";
}

TEST(Fault, HangIsCaughtByTheWatchdog) {
  testing::TempDir dir("fault");
  const std::string out = dir.file("hang.json");
  testing::ProcessResult run;
  const double seconds = seconds_of([&] {
    run =
        run_process(mpiexec(4) + kEmu + kSmall + " --strategies zero3 --fault hang:1:2 --watchdog 2 --json " + out, 60);
  });
  EXPECT_EQ(run.exit_code, 3) << run.err;
  EXPECT_LT(seconds, 30.0);
  // Every rank still running says which collective it waits in.
  for (int r : {0, 2, 3}) {
    EXPECT_NE(run.err.find("[r" + std::to_string(r) + "/4] coll: watchdog: "), std::string::npos) << run.err;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(Fault, MismatchedCollectivesAreNamed) {
  const auto run = run_process(mpiexec(4) + kEmu + kSmall +
                                   " --strategies zero3 --fault mismatch:1:2 "
                                   "--check-collectives",
                               60);
  EXPECT_EQ(run.exit_code, 3) << run.err;
  EXPECT_NE(run.err.find("r1: barrier"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("r0,r2,r3: all_gather"), std::string::npos) << run.err;
}

TEST(Fault, BadFaultsAreBadInput) {
  for (const char* bad : {"--fault kill:9:1", "--fault explode:1:1", "--fault delay:1", "--fault hang:x:2",
                          "--watchdog -1", "--fault kill:1:3"}) {  // kSmall runs 2 steps: step 3 never comes
    const auto run = run_process(mpiexec(2) + kEmu + kSmall + " " + bad);
    EXPECT_EQ(run.exit_code, 2) << bad << "\n" << run.err;
    EXPECT_EQ(count_of(run.err, "emu: error: "), 1) << bad << "\n" << run.err;
  }
}

TEST(Fault, AFaultThatNeverFiresFailsTheRun) {
  // The first strategy runs out of memory in step 1 and stops, so the kill asked for at step 2 never happens: a
  // fault test that relied on it would pass without testing anything.
  const auto run =
      run_process(mpiexec(2) + kEmu + kSmall + " --strategies ddp --cap 2GB-scaled --reserve 0 --fault kill:1:2");
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_EQ(count_of(run.err,
                     "emu: --fault kill:1:2 never fired: ddp, the strategy faults strike, stopped after "
                     "step 1"),
            1)
      << run.err;
}

}  // namespace
}  // namespace emu
