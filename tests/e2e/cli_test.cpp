// The emu executable end to end: what a user and a CI job see — exit codes, one clear message, the run header.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/emu_process.h"

namespace emu {
namespace {

using testing::count_of;
using testing::mpiexec;
using testing::run_process;

using testing::kEmu;

// A run small enough for a test: GPT-2 (124M), shrunk by the default rule (k = 8), one strategy, one step.
const std::string kQuick = " --model gpt2 --strategies ddp --steps 1";

TEST(Cli, HelpAndVersionExitZero) {
  const auto help = run_process(kEmu + " --help");
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("--cap"), std::string::npos);
  EXPECT_NE(help.out.find("--shrink"), std::string::npos);
  const auto version = run_process(mpiexec(2) + kEmu + " --version");
  EXPECT_EQ(version.exit_code, 0) << version.err;
  EXPECT_EQ(count_of(version.out, "emu " EMU_VERSION), 1) << "printed once, by rank 0: " << version.out;
}

TEST(Cli, HeaderShowsTheCapArithmetic) {
  const auto run = run_process(mpiexec(4) + kEmu +
                               " --cap 40GB-scaled --model llama2-13b --shrink 64 --steps 1 "
                               "--strategies zero3");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("4 ranks on 1 host"), std::string::npos) << run.out;
  // 40 GB / 64^2 = 9,765,625 bytes.
  EXPECT_NE(run.out.find("/ 64^2 = 9.31 MiB (9765625 bytes) per rank"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("reserve"), std::string::npos) << run.out;
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(run.out.find("rank " + std::to_string(r)), std::string::npos) << run.out;
  }
}

// The header names the BLAS the matrix products run on and its kernels (their speed is the run's); a plan, which does
// no math, does not.
TEST(Cli, HeaderNamesTheBlasKernelsOfARunNotOfAPlan) {
  const auto run = run_process(mpiexec(2) + kEmu + kQuick);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(count_of(run.out, "\n  blas      OpenBLAS "), 1) << run.out;
  const auto plan = run_process(kEmu + " --plan 8 --model gpt2 --strategies ddp");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_EQ(count_of(plan.out, "  blas  "), 0) << plan.out;
}

TEST(Cli, NamedGpuCap) {
  const auto run = run_process(mpiexec(1) + kEmu + " --cap a100-40gb-scaled" + kQuick);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("a100-40gb (39.59 GiB, 42509438812 bytes) / 8^2 = 633.44 MiB (664209981 bytes)"),
            std::string::npos)
      << run.out;
  EXPECT_EQ(run.out.find("note: one a100-40gb per shrunk rank"), std::string::npos) << run.out;
}

// A named GPU without "-scaled" on a shrunk run stands for 8^2 = 64 such GPUs per rank: the header says so and
// names the cap that means the GPU itself.
TEST(Cli, NamedGpuCapWithoutScaledIsPointedOut) {
  const auto run = run_process(mpiexec(1) + kEmu + " --cap a100-40gb" + kQuick);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("stands for 2.47 TiB at full scale (x 8^2)"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("note: one a100-40gb per shrunk rank; --cap a100-40gb-scaled stands for the GPU itself"),
            std::string::npos)
      << run.out;
}

// EMU_LOG=time=info, what README's Speed profile is read from: every rank says when each phase ended, in order, the
// wall and CPU seconds so far each with the phase's own share; without it, not a line.
TEST(Cli, TimeLogNamesEveryPhaseOnEveryRankWithItsShare) {
  const std::string args = kEmu + " --model gpt2 --strategies ddp,zero2 --steps 2";
  const auto quiet = run_process(mpiexec(2) + args);
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(count_of(quiet.err, "time: "), 0) << quiet.err;
  const auto run = run_process("env EMU_LOG=time=info " + mpiexec(2) + args);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::vector<std::string> phases = {"MPI_Init and the command line", "header", "initial weights"};
  for (const std::string strategy : {"ddp", "zero2"}) {
    for (const char* phase :
         {"device and communicators", "set-up", "predictions", "step 1", "step 2", "results gathered"}) {
      phases.push_back(strategy + ": " + phase);
    }
  }
  phases.insert(phases.end(), {"report and files", "MPI_Finalize"});
  for (int r = 0; r < 2; ++r) {
    const std::string tag = "[r" + std::to_string(r) + "/2] time: ";
    size_t at = 0;
    double wall = 0, cpu = 0;
    for (const std::string& phase : phases) {
      at = run.err.find(tag + phase + ": wall ", at);
      ASSERT_NE(at, std::string::npos) << tag << phase << " missing or out of order:\n" << run.err;
      double now_wall = 0, share_wall = 0, now_cpu = 0, share_cpu = 0;
      ASSERT_EQ(std::sscanf(run.err.c_str() + at + tag.size() + phase.size(), ": wall %lf s (+%lf), CPU %lf s (+%lf)",
                            &now_wall, &share_wall, &now_cpu, &share_cpu),
                4)
          << run.err.substr(at, 120);
      // Each share is the difference from the rank's previous line (printed to the millisecond).
      EXPECT_NEAR(now_wall, wall + share_wall, 0.0015) << tag << phase;
      EXPECT_NEAR(now_cpu, cpu + share_cpu, 0.0015) << tag << phase;
      EXPECT_GE(share_wall, 0) << tag << phase;
      EXPECT_GE(share_cpu, 0) << tag << phase;
      wall = now_wall;
      cpu = now_cpu;
    }
    EXPECT_GT(cpu, 0) << tag << "the rank trained two strategies";
  }
}

// A DeepSpeed config as DeepSpeedExamples write them (train_batch_size, no micro-batch): DeepSpeed's arithmetic over
// the ranks the run stands for — 4096 / (1 × 64) = 64 for --plan 64 — and a key emu does not model warned about
// once per job, not once per rank.
TEST(Cli, DeepSpeedBatchArithmeticUsesThePlansRanksAndWarnsOnce) {
  testing::TempDir dir("cli");
  const std::string config = dir.file("ds.json");
  std::ofstream(config) << R"({"train_batch_size": 4096, "gradient_accumulation_steps": 1,
                              "zero_optimization": {"stage": 1}, "bf16": {"enabled": "auto"}, "amp": {}})";
  const auto run = run_process(mpiexec(2) + kEmu + " --model gpt2 --plan 64 --deepspeed " + config);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("micro-batch 64, seq-len 1024"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("mixed precision"), std::string::npos) << "\"auto\" keeps emu's default:\n" << run.out;
  EXPECT_EQ(count_of(run.err, "not modelled by emu, ignored: amp"), 1) << run.err;
  const auto fp32 = run_process(mpiexec(2) + kEmu + " --model gpt2 --plan 64 --precision fp32 --deepspeed " + config);
  EXPECT_NE(fp32.out.find("fp32 precision"), std::string::npos) << "the flag wins:\n" << fp32.out;
}

// --plan alone, as the README writes it (--plan [N]): the ranks emu runs on, as --plan 0; a value or the next flag
// still follows it.
TEST(Cli, PlanWithoutAValuePlansForTheRanksEmuRunsOn) {
  const std::string plan_for_2 = "plan      shapes only at full scale for 2 ranks";
  for (const char* plan : {" --plan", " --plan 0", " --plan --seed 7"}) {
    const auto run = run_process(mpiexec(2) + kEmu + kQuick + plan);
    ASSERT_EQ(run.exit_code, 0) << plan << "\n" << run.err;
    EXPECT_EQ(count_of(run.out, plan_for_2), 1) << plan << "\n" << run.out;
  }
  const auto then_cap = run_process(mpiexec(1) + kEmu + kQuick + " --plan --cap 40GB");
  ASSERT_EQ(then_cap.exit_code, 0) << then_cap.err;
  EXPECT_NE(then_cap.out.find("cap       37.25 GiB per GPU, as stated"), std::string::npos) << then_cap.out;
  const auto eight = run_process(mpiexec(1) + kEmu + kQuick + " --plan 8");
  ASSERT_EQ(eight.exit_code, 0) << eight.err;
  EXPECT_EQ(count_of(eight.out, "plan      shapes only at full scale for 8 ranks"), 1) << eight.out;
  const auto help = run_process(kEmu + " --help");
  EXPECT_NE(help.out.find("--plan [N]"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("'--plan' alone or '--plan 0' plans for the ranks emu runs on"), std::string::npos)
      << help.out;
}

// The memory table's "states" (what the highest-peaking rank held in model states) and "predicted" are the same
// rank's: torchtitan's 3-D llama2-70b on 64 peaks on the second stage (ranks 8-15, which hold the final norm and
// the head besides their blocks), whose states are not rank 0's. 40.42 GiB both.
TEST(Cli, MemoryTablePredictsTheStatesOfTheRankThatPeaked) {
  const auto plan = run_process(kEmu + " --plan 64 --model llama2-70b --cap h100-80gb --strategies 3d --tp 8 --pp 2");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  const size_t row = plan.out.find("\nfsdp2·pp2·tp8 ");
  ASSERT_NE(row, std::string::npos) << plan.out;
  const std::string line = plan.out.substr(row + 1, plan.out.find('\n', row + 1) - row - 1);
  std::istringstream words(line.substr(line.rfind('|') + 1));
  std::string states, predicted;
  words >> states >> predicted;
  EXPECT_EQ(states, "40.42") << line;
  EXPECT_EQ(predicted, states) << line;
}

struct BadInput {
  std::string args;
  std::string message;        // a piece of the expected message
  std::string base = kQuick;  // what comes before `args` (a flag given twice is an error of its own)
  friend void PrintTo(const BadInput& bad, std::ostream* os) { *os << bad.args; }
};

class CliBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(CliBadInput, ExitsTwoWithOneMessageAndTheSameVerdictOnEveryRank) {
  const BadInput& bad = GetParam();
  for (int ranks : {1, 8}) {
    const auto run = run_process("env EMU_LOG=app=debug " + mpiexec(ranks) + kEmu + bad.base + " " + bad.args);
    EXPECT_EQ(run.exit_code, 2) << bad.args << "\n" << run.err;
    EXPECT_EQ(count_of(run.err, "emu: error: "), 1) << "one message, from rank 0:\n" << run.err;
    EXPECT_NE(run.err.find(bad.message), std::string::npos) << run.err;
    // Every rank logs the same verdict.
    for (int r = 0; r < ranks; ++r) {
      const std::string tag = "[r" + std::to_string(r) + "/" + std::to_string(ranks) + "] app: verdict: bad input";
      EXPECT_EQ(count_of(run.err, tag), 1) << tag << "\n" << run.err;
    }
    EXPECT_EQ(count_of(run.err, "verdict: bad input (exit 2): "), ranks) << run.err;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, CliBadInput,
    ::testing::Values(BadInput{"--cap 40XB", "--cap '40XB' is not a cap specification; accepted: a size"},
                      BadInput{"--cap none-scaled", "--cap 'none-scaled'"}, BadInput{"--cap -5GB", "--cap"},
                      BadInput{"--cap a100", "a100-40gb = 39.59 GiB"},
                      BadInput{"--shrink 0", "--shrink 0 is out of range; accepted for gpt2: 1, 2, 4, 8, 16, 32, 64"},
                      BadInput{"--shrink 3", "shrink"}, BadInput{"--shrink many", "--shrink"},
                      BadInput{"--reserve lots", "--cap 'lots'"},
                      BadInput{"--reserve 1GB-scaled", "--reserve '1GB-scaled' must be a plain size"},
                      BadInput{"--no-such-flag", "--no-such-flag"},
                      BadInput{"--log loud", "log level 'loud' is not one of"},
                      BadInput{"--comm-hook fp16", "--comm-hook 'fp16' is not one of none, bf16"},
                      BadInput{"--device tpu", "--device 'tpu' is not a backend; accepted: cpu, cuda"},
                      BadInput{"--device cuda", "--device cuda: this build has cpu, shapes only"},
                      BadInput{"--expect zero3=oom",
                               "--expect 'zero3=oom': zero3 does not run; the strategies that run: ddp"},
                      BadInput{"--micro-batch 0", "--micro-batch 0 is out of range; accepted: 1 to 4096"},
                      BadInput{"--seq-len 0", "--seq-len 0 is out of range; accepted: 1 to 1048576"},
                      BadInput{"--grad-accum 0", "--grad-accum 0 is out of range; accepted: 1 to 4096"},
                      BadInput{"--strategies ''", "--strategies '' names no strategy; accepted: one or more of ddp",
                               " --model gpt2 --steps 1"},
                      BadInput{"--json same.json --svg same.json", "--json and --svg both write 'same.json'"},
                      BadInput{"--json same.json --trace ./same.json", "--json and --trace both write './same.json'"},
                      BadInput{"--strategy zero3", "--strategy; did you mean --strategies?"},
                      BadInput{"--cpa 40GB", "--cpa; did you mean --cap?"}));

}  // namespace
}  // namespace emu
