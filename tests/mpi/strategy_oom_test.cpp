// Out of memory without deadlock: ranks that pass their cap finish the step; all ranks agree on who ran out and
// where; caps between two strategies' needs let one fit and the other run out.
#include <gtest/gtest.h>

#include "strategies/analytic.h"
#include "strategies/oom.h"
#include "tests/mpi/strategy_harness.h"

namespace emu::testing {
namespace {

MemoryPool::Options recording_cap(uint64_t cap) {
  MemoryPool::Options memory;
  memory.cap = cap;
  memory.mode = OomMode::kRecord;
  return memory;
}

// What one rank of `name` needs at its peak, measured with no cap.
// DeepSpeed's default ipg bucket (5e8 elements, 1 GB in bf16) dwarfs these tiny models: ZeRO-3 keeps it all run.
// A bucket sized for the model, as a user of a small model would set reduce_bucket_size, keeps the comparison
// about sharding.
strategy::StrategyOptions sized_options(const char* name) {
  strategy::StrategyOptions options = test_options(name, optim::Recipe::kMixed);
  options.zero.reduce_bucket_elements = 1024;
  return options;
}

uint64_t measured_peak(const char* name) {
  auto run = run_strategy(model::Style::kLlama, sized_options(name), 1, 1);
  uint64_t peak = run->device->memory().peak();
  MPI_Allreduce(MPI_IN_PLACE, &peak, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return peak;
}

TEST(Oom, OnlySomeRanksRunOutAndEveryRankGetsTheSameReport) {
  const int rank = world_rank();
  const int world = world_size();
  const uint64_t need = measured_peak("zero2");
  // Odd ranks get a cap just below what the step needs, even ranks plenty.
  const uint64_t cap = rank % 2 == 1 ? need - need / 10 : need * 2;
  auto run = run_strategy(model::Style::kLlama, sized_options("zero2"), 1, 2, recording_cap(cap));
  auto control = run->world->split(0, rank, "control");
  const strategy::OomVerdict verdict = strategy::agree_on_oom(run->device->memory(), *control);
  std::vector<int> expected;
  for (int r = 1; r < world; r += 2) expected.push_back(r);
  EXPECT_EQ(verdict.failing_ranks(), expected);
  EXPECT_EQ(verdict.any(), world > 1);
  for (int r : expected) {
    const strategy::RankMemory& info = verdict.ranks[static_cast<size_t>(r)];
    EXPECT_GT(info.peak, info.cap) << "the report says what rank " << r << " would have needed";
    EXPECT_FALSE(info.phase.empty());
    EXPECT_GT(info.requested, 0u);
  }
  // Every rank holds the same summary.
  const std::string summary = verdict.summary();
  std::vector<int> lengths(static_cast<size_t>(world));
  const int length = static_cast<int>(summary.size());
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int l : lengths) EXPECT_EQ(l, length) << summary;
  if (world > 1) {
    EXPECT_NE(summary.find("ran out of memory"), std::string::npos) << summary;
  }
}

TEST(Oom, CapBetweenTwoStrategiesNeedsFitsOneAndNotTheOther) {
  if (world_size() < 4) GTEST_SKIP() << "sharding saves too little below 4 ranks for this tiny model";
  const uint64_t ddp = measured_peak("ddp");
  const uint64_t zero3 = measured_peak("zero3");
  ASSERT_LT(zero3, ddp);
  const uint64_t cap = (ddp + zero3) / 2;
  for (const char* name : {"ddp", "zero3"}) {
    auto run = run_strategy(model::Style::kLlama, sized_options(name), 1, 1, recording_cap(cap));
    auto control = run->world->split(0, world_rank(), "control");
    const auto verdict = strategy::agree_on_oom(run->device->memory(), *control);
    EXPECT_EQ(verdict.any(), std::string(name) == "ddp") << name << ": " << verdict.summary();
  }
}

TEST(Oom, StrictModeThrowsAtTheAllocation) {
  // Setup alone needs more than 1 KiB on every rank: each throws before any collective, so none waits.
  MemoryPool::Options memory;
  memory.cap = 1024;
  memory.mode = OomMode::kStrict;
  EXPECT_THROW(run_strategy(model::Style::kLlama, test_options("ddp", optim::Recipe::kMixed), 1, 1, memory),
               OutOfMemoryError);
}

}  // namespace
}  // namespace emu::testing
