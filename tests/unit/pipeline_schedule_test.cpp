// The pipeline schedules' order and timing (strategies/pipeline.h), against hand-worked diagrams: the order the
// `pp` strategy runs and the trace's pipeline view draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include <string>
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

// "F0.1" → the forward of micro-batch 0 through chunk 1.
std::vector<PipelineOp> chunk_ops(const std::vector<const char*>& names) {
  std::vector<PipelineOp> out;
  out.reserve(names.size());
  for (const char* name : names) out.push_back({name[0] == 'F', name[1] - '0', name[3] - '0'});
  return out;
}

// Megatron-LM's forward_backward_pipelining_with_interleaving for P = 2, V = 2, M = 4, written out by hand from its
// rules. The schedule table (groups of P = 2 micro-batches, each through chunk 0 then chunk 1):
//   virtual k   0    1    2    3    4    5    6    7
//   forward     0.0  1.0  0.1  1.1  2.0  3.0  2.1  3.1      (micro-batch.chunk; a backward's chunk is 1 − this)
// Warm-up 2(P − s − 1) + (V − 1)P: stage 0 4 forwards, stage 1 2; then forward k + warm-up and backward k in turn
// for the remaining 8 − warm-up; then the last backwards.
TEST(PipelineSchedule, InterleavedOrderAsMegatronRunsIt) {
  EXPECT_EQ(stage_order(Schedule::k1F1B, 2, 0, 4, 2),
            chunk_ops({"F0.0", "F1.0", "F0.1", "F1.1",                  // warm-up: k = 0..3
                       "F2.0", "B0.1", "F3.0", "B1.1", "F2.1", "B0.0",  // steady: F k+4, B k for k = 0..3
                       "F3.1", "B1.0",                                  //
                       "B2.1", "B3.1", "B2.0", "B3.0"}));               // cool-down: B k for k = 4..7
  EXPECT_EQ(stage_order(Schedule::k1F1B, 2, 1, 4, 2),
            chunk_ops({"F0.0", "F1.0",                                  // warm-up: k = 0, 1
                       "F0.1", "B0.1", "F1.1", "B1.1", "F2.0", "B0.0",  // steady: F k+2, B k for k = 0..5
                       "F3.0", "B1.0", "F2.1", "B2.1", "F3.1", "B3.1",  //
                       "B2.0", "B3.0"}));                               // cool-down: B k for k = 6, 7
}

// Megatron's layer offsets (get_transformer_layer_offset): 8 blocks, P = 2, V = 2 are four groups of 2; chunk v of
// stage p holds group v·P + p.
TEST(PipelineSchedule, InterleavedChunksHoldLayerGroupVPPlusP) {
  const auto chunks = interleaved_chunks(8, 2, 2);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0][0].first, 1);
  EXPECT_EQ(chunks[0][0].last, 2);
  EXPECT_EQ(chunks[0][1].first, 5);
  EXPECT_EQ(chunks[0][1].last, 6);
  EXPECT_EQ(chunks[1][0].first, 3);
  EXPECT_EQ(chunks[1][0].last, 4);
  EXPECT_EQ(chunks[1][1].first, 7);
  EXPECT_EQ(chunks[1][1].last, 8);
}

// Chunk micro-batches in flight: the warm-up plus the one of the steady state, min(2(P − s − 1) + (V − 1)P + 1, VM).
// P = 2, V = 2, M = 4: stage 0 2 + 2 + 1 = 5, stage 1 0 + 2 + 1 = 3. P = 4, V = 2, M = 8: 6 + 4 + 1 = 11, 9, 7, 5;
// each is 1/V of the stage's blocks, so stage 0 holds 11/2 = 5.5 micro-batches' activations: P + (P − 1)/V, against
// 1F1B's P = 4 (Korthikanti et al. 2022: 1 + (P − 1)/(PV) times as much). M = P = 4 caps stage 0 at VM = 8.
TEST(PipelineSchedule, InterleavedInFlightPerStage) {
  EXPECT_EQ(most_in_flight(stage_order(Schedule::k1F1B, 2, 0, 4, 2)), 5);
  EXPECT_EQ(most_in_flight(stage_order(Schedule::k1F1B, 2, 1, 4, 2)), 3);
  const std::vector<int> want{11, 9, 7, 5};
  for (int s = 0; s < 4; ++s) EXPECT_EQ(most_in_flight(stage_order(Schedule::k1F1B, 4, s, 8, 2)), want[s]) << s;
  EXPECT_EQ(most_in_flight(stage_order(Schedule::k1F1B, 4, 0, 4, 2)), 8);
}

// The interleaved timeline with a chunk's forward 1 and backward 2 (each chunk 1/V of a stage's work): every stage is
// busy 3·V·M and the step ends at 3(V·M + P − 1), a bubble of (P − 1)/(V·M + P − 1): P = 2, V = 2, M = 4 ends at
// 3 · 9 = 27 (1F1B with the same work per stage, forward 2 and backward 4: 6 · 5 = 30); P = 4, V = 2, M = 8 at 57.
TEST(PipelineSchedule, InterleavedBubbleIsPMinusOneOverVM) {
  const auto end_of = [](const std::vector<std::vector<TimedOp>>& timeline) {
    double end = 0;
    for (const auto& stage : timeline) end = std::max(end, stage.back().end);
    return end;
  };
  EXPECT_DOUBLE_EQ(end_of(pipeline_timeline(Schedule::k1F1B, 2, 4, 1.0, 2.0, 2)), 27.0);
  EXPECT_DOUBLE_EQ(end_of(pipeline_timeline(Schedule::k1F1B, 2, 4, 2.0, 4.0)), 30.0);
  EXPECT_DOUBLE_EQ(end_of(pipeline_timeline(Schedule::k1F1B, 4, 8, 1.0, 2.0, 2)), 57.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(2, 4, 2), 1.0 / 9.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 8, 2), 3.0 / 19.0);
  for (const auto& [p, v, m] : std::vector<std::tuple<int, int, int>>{
           {2, 2, 4}, {4, 2, 8}, {4, 3, 8}, {8, 2, 16}, {3, 4, 6}, {4, 2, 4}, {2, 4, 2}}) {
    const double end = end_of(pipeline_timeline(Schedule::k1F1B, p, m, 1.0, 2.0, v));
    EXPECT_DOUBLE_EQ(end, 3.0 * (v * m + p - 1)) << "P " << p << " V " << v << " M " << m;
    EXPECT_NEAR(1 - 3.0 * v * m / end, bubble_fraction(p, m, v), 1e-12);
  }
}

// Every stage's program run with sends that block until the peer receives (rendezvous, as MPI's large messages): a
// send and a receive complete only when both stages have reached them; ops never wait.
class Rendezvous {
 public:
  Rendezvous(Schedule schedule, int stages, int chunks, int micro_batches)
      : stages_(stages), chunks_(chunks), at_(static_cast<size_t>(stages), 0), ran_(at_.size()), received_(at_.size()) {
    programs_.reserve(at_.size());
    for (int s = 0; s < stages; ++s) programs_.push_back(stage_program(schedule, stages, s, micro_batches, chunks));
  }
  // Runs until no stage moves; `name` labels failures.
  void run(const std::string& name) {
    for (bool moved = true; moved;) {
      moved = false;
      for (int s = 0; s < stages_; ++s) {
        const bool computed = run_ops(s, name);
        const bool delivered = deliver(s, name);
        moved = moved || computed || delivered;
      }
    }
  }
  bool finished(int stage) const { return at_[idx(stage)] == programs_[idx(stage)].size(); }
  const std::vector<PipelineOp>& ran(int stage) const { return ran_[idx(stage)]; }

 private:
  static size_t idx(int stage) { return static_cast<size_t>(stage); }
  // The stage's ops up to its next message. Only the first stage's chunk-0 forwards (the embedding) and the last
  // stage's chunk-(V − 1) backwards (the loss) read no message; every other op's must have been received.
  bool run_ops(int s, const std::string& name) {
    size_t& i = at_[idx(s)];
    const std::vector<StageEvent>& program = programs_[idx(s)];
    const size_t before = i;
    for (; i < program.size() && program[i].kind == StageEvent::Kind::kCompute; ++i) {
      const PipelineOp& op = program[i].op;
      const bool reads = op.forward ? !(s == 0 && op.chunk == 0) : !(s == stages_ - 1 && op.chunk == chunks_ - 1);
      const auto& got = received_[idx(s)];
      EXPECT_EQ(reads, std::find(got.begin(), got.end(), op) != got.end()) << name << ": stage " << s;
      ran_[idx(s)].push_back(op);
    }
    return i != before;
  }
  // The stage's next send, if its peer's next event is the matching receive: made here before it is sent, to the
  // stage that reads it (activations to the next stage, the last stage's chunk v to the first's chunk v + 1;
  // gradients back).
  bool deliver(int s, const std::string& name) {
    size_t& i = at_[idx(s)];
    if (i == programs_[idx(s)].size() || programs_[idx(s)][i].kind != StageEvent::Kind::kSend) return false;
    const StageEvent& send = programs_[idx(s)][i];
    size_t& j = at_[idx(send.peer)];
    const std::vector<StageEvent>& peer = programs_[idx(send.peer)];
    if (j == peer.size() || peer[j].kind != StageEvent::Kind::kReceive || peer[j].peer != s) return false;
    const auto& mine = ran_[idx(s)];
    EXPECT_NE(std::find(mine.begin(), mine.end(), send.op), mine.end()) << name << ": sent before it was made";
    const bool wraps = send.op.forward ? s == stages_ - 1 : s == 0;
    const int chunk = send.op.chunk + (wraps ? (send.op.forward ? 1 : -1) : 0);
    EXPECT_EQ(send.peer, (s + (send.op.forward ? 1 : stages_ - 1)) % stages_) << name;
    EXPECT_EQ(peer[j].op, (PipelineOp{send.op.forward, send.op.micro_batch, chunk})) << name;
    received_[idx(send.peer)].push_back(peer[j].op);
    ++i, ++j;
    return true;
  }

  int stages_, chunks_;
  std::vector<std::vector<StageEvent>> programs_;
  std::vector<size_t> at_;
  std::vector<std::vector<PipelineOp>> ran_, received_;  // per stage: the ops run; the messages in, by their reader
};

// Every stage's program runs to the end over blocking sends, each message received before the op that reads it and
// sent after the op that made it, and the ops in the schedule's order.
TEST(PipelineSchedule, ProgramsNeverDeadlockOnBlockingSends) {
  for (const auto& [p, v, m, schedule] : std::vector<std::tuple<int, int, int, Schedule>>{{2, 1, 3, Schedule::kGpipe},
                                                                                          {4, 1, 6, Schedule::kGpipe},
                                                                                          {2, 1, 1, Schedule::k1F1B},
                                                                                          {4, 1, 6, Schedule::k1F1B},
                                                                                          {8, 1, 3, Schedule::k1F1B},
                                                                                          {2, 2, 4, Schedule::k1F1B},
                                                                                          {3, 2, 6, Schedule::k1F1B},
                                                                                          {4, 2, 8, Schedule::k1F1B},
                                                                                          {4, 3, 4, Schedule::k1F1B},
                                                                                          {8, 2, 8, Schedule::k1F1B},
                                                                                          {2, 4, 6, Schedule::k1F1B}}) {
    const std::string name = "P " + std::to_string(p) + " V " + std::to_string(v) + " M " + std::to_string(m);
    Rendezvous rendezvous(schedule, p, v, m);
    rendezvous.run(name);
    for (int s = 0; s < p; ++s) {
      EXPECT_TRUE(rendezvous.finished(s)) << name << ": stage " << s << " stuck";
      EXPECT_EQ(rendezvous.ran(s), stage_order(schedule, p, s, m, v)) << name << ": stage " << s;
    }
  }
}

}  // namespace
}  // namespace emu::strategy
