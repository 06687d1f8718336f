// The pipeline schedules' order and timing (strategies/pipeline.h), against hand-worked diagrams: the order the
// `pp` strategy runs and the trace's pipeline view draws.
#include <gtest/gtest.h>

#include <vector>

#include "strategies/pipeline.h"
#include "strategies/strategy.h"

namespace emu::strategy {
namespace {

// "F0 F1 B0 B1" → ops.
std::vector<PipelineOp> ops(const std::vector<const char*>& names) {
  std::vector<PipelineOp> out;
  out.reserve(names.size());
  for (const char* name : names) out.push_back({name[0] == 'F', name[1] - '0'});
  return out;
}

TEST(PipelineSchedule, GpipeRunsEveryForwardThenEveryBackward) {
  EXPECT_EQ(stage_order(Schedule::kGpipe, 4, 0, 3), ops({"F0", "F1", "F2", "B0", "B1", "B2"}));
  EXPECT_EQ(stage_order(Schedule::kGpipe, 4, 3, 3), ops({"F0", "F1", "F2", "B0", "B1", "B2"}));
}

// Megatron-LM's forward_backward_pipelining_without_interleaving, P = 4, M = 6: stage s warms up with P − s − 1
// forwards, alternates, and cools down with the rest.
TEST(PipelineSchedule, OneFOneBWarmsUpWithPMinusSMinusOneForwards) {
  EXPECT_EQ(stage_order(Schedule::k1F1B, 4, 0, 6),
            ops({"F0", "F1", "F2", "F3", "B0", "F4", "B1", "F5", "B2", "B3", "B4", "B5"}));
  EXPECT_EQ(stage_order(Schedule::k1F1B, 4, 2, 6),
            ops({"F0", "F1", "B0", "F2", "B1", "F3", "B2", "F4", "B3", "F5", "B4", "B5"}));
  EXPECT_EQ(stage_order(Schedule::k1F1B, 4, 3, 6),
            ops({"F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3", "F4", "B4", "F5", "B5"}));
  // Fewer micro-batches than stages: the warm-up is every micro-batch.
  EXPECT_EQ(stage_order(Schedule::k1F1B, 4, 0, 2), ops({"F0", "F1", "B0", "B1"}));
}

// The activations a stage holds: GPipe all M; 1F1B min(P − s, M) (0-based s), the first stage the most.
TEST(PipelineSchedule, InFlightMicroBatchesPerStage) {
  for (int m : {1, 3, 8}) {
    for (int s = 0; s < 4; ++s) {
      EXPECT_EQ(most_in_flight(stage_order(Schedule::kGpipe, 4, s, m)), m);
      EXPECT_EQ(most_in_flight(stage_order(Schedule::k1F1B, 4, s, m)), std::min(4 - s, m)) << "s " << s << " m " << m;
    }
  }
}

// P = 2, M = 2, forward 1 s, backward 2 s, drawn by hand:
//   GPipe  stage 0: F0 [0,1] F1 [1,2] . . . B0 [5,7] B1 [7,9]
//          stage 1:         F0 [1,2] F1 [2,3] B0 [3,5] B1 [5,7]
//   1F1B   stage 0: F0 [0,1] F1 [1,2] . . B0 [4,6] . B1 [7,9]
//          stage 1:         F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]
TEST(PipelineSchedule, TimelineMatchesTheHandDrawnDiagrams) {
  const auto gpipe = pipeline_timeline(Schedule::kGpipe, 2, 2, 1.0, 2.0);
  ASSERT_EQ(gpipe.size(), 2u);
  const std::vector<std::pair<double, double>> gpipe0{{0, 1}, {1, 2}, {5, 7}, {7, 9}};
  const std::vector<std::pair<double, double>> gpipe1{{1, 2}, {2, 3}, {3, 5}, {5, 7}};
  const auto onefoneb = pipeline_timeline(Schedule::k1F1B, 2, 2, 1.0, 2.0);
  const std::vector<std::pair<double, double>> onefoneb0{{0, 1}, {1, 2}, {4, 6}, {7, 9}};
  const std::vector<std::pair<double, double>> onefoneb1{{1, 2}, {2, 4}, {4, 5}, {5, 7}};
  const auto expect = [](const std::vector<TimedOp>& got, const std::vector<std::pair<double, double>>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_DOUBLE_EQ(got[i].start, want[i].first) << "op " << i;
      EXPECT_DOUBLE_EQ(got[i].end, want[i].second) << "op " << i;
    }
  };
  expect(gpipe[0], gpipe0);
  expect(gpipe[1], gpipe1);
  expect(onefoneb[0], onefoneb0);
  expect(onefoneb[1], onefoneb1);
}

// Equal stages: both schedules end at (M + P − 1)(f + b); each stage is busy M(f + b) of it, the rest is the bubble
// (P − 1)/(M + P − 1).
TEST(PipelineSchedule, BothSchedulesTakeMPlusPMinusOneSlots) {
  for (const Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B}) {
    for (const auto& [p, m] : std::vector<std::pair<int, int>>{{4, 8}, {8, 8}, {8, 3}, {1, 5}}) {
      const auto timeline = pipeline_timeline(schedule, p, m, 1.0, 2.0);
      double end = 0;
      for (const auto& stage : timeline) {
        end = std::max(end, stage.back().end);
        double busy = 0;
        for (const TimedOp& op : stage) busy += op.end - op.start;
        EXPECT_DOUBLE_EQ(busy, 3.0 * m);
      }
      EXPECT_DOUBLE_EQ(end, 3.0 * (m + p - 1)) << "P " << p << " M " << m;
      EXPECT_NEAR(1 - 3.0 * m / end, bubble_fraction(p, m), 1e-12);
    }
  }
}

}  // namespace
}  // namespace emu::strategy
