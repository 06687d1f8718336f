// The teaching view's ordering: logical rounds from the exchanges every rank logged, the text and the trace.
#include <gtest/gtest.h>

#include "collectives/tools/teach_view.h"
#include "collectives/topology.h"

namespace emu::coll::teach {
namespace {

// What each rank of a ring all-reduce logs: 2(N-1) exchanges with its neighbours.
Logs ring_logs(int n) {
  Logs logs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (int step = 0; step < 2 * (n - 1); ++step) {
      logs[static_cast<size_t>(r)].push_back(
          StepRecord{"step", ring_next(r, n), 0, 8, ring_prev(r, n), 0, 8, step < n - 1});
    }
  }
  return logs;
}

// What each rank of a binomial broadcast from rank 0 logs.
Logs tree_logs(int n) {
  Logs logs(static_cast<size_t>(n));
  for (int v = 0; v < n; ++v) {
    auto& log = logs[static_cast<size_t>(v)];
    if (v != 0) log.push_back(StepRecord{"receive", kNoPeer, -1, 0, binomial_parent(v), -1, 16, false});
    for (int child : binomial_children(v, n)) log.push_back(StepRecord{"send", child, -1, 16, kNoPeer, -1, 0, false});
  }
  return logs;
}

TEST(TeachRounds, RingRanksMoveInLockStep) {
  const auto rounds = logical_rounds(ring_logs(5));
  for (const auto& rank_rounds : rounds) {
    ASSERT_EQ(rank_rounds.size(), 8u);
    for (size_t i = 0; i < rank_rounds.size(); ++i) EXPECT_EQ(rank_rounds[i], static_cast<int>(i) + 1);
  }
}

TEST(TeachRounds, BinomialBroadcastTakesLogNRounds) {
  const Logs logs = tree_logs(8);
  const auto rounds = logical_rounds(logs);
  EXPECT_EQ(rounds[0], (std::vector<int>{1, 2, 3})) << "the root sends to 4, 2, 1 in rounds 1, 2, 3";
  EXPECT_EQ(rounds[4], (std::vector<int>{1, 2, 3})) << "r4 receives in round 1, then sends to 6 and 5";
  EXPECT_EQ(rounds[7], (std::vector<int>{3}));
  const std::string text = format_steps(logs, rounds, 4);
  EXPECT_NE(text.find("round 3"), std::string::npos);
  EXPECT_EQ(text.find("round 4"), std::string::npos);
  EXPECT_NE(text.find("sends 16 B to r4"), std::string::npos) << text;
}

TEST(TeachTrace, OneTrackPerRankAndAnArrowPerMessage) {
  const Logs logs = ring_logs(3);
  const auto trace = chrome_trace(logs, logical_rounds(logs), "ring");
  int tracks = 0;
  int slices = 0;
  int arrows = 0;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "thread_name") ++tracks;
    if (event["ph"] == "X") ++slices;
    if (event["ph"] == "s") ++arrows;
  }
  EXPECT_EQ(tracks, 3);
  EXPECT_EQ(slices, 3 * 4);
  EXPECT_EQ(arrows, 3 * 4);
  EXPECT_EQ(from_json(to_json(logs[1])).size(), logs[1].size());
}

// A ring all-reduce over n ranks as the ring really schedules it (topology.h), blocks of 2 fp32 elements; with
// `copy_in_reduce_scatter` the first half copies instead of adding, the bug the contents view must catch.
Logs real_ring_logs(int n, bool copy_in_reduce_scatter) {
  Logs logs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    for (int step = 0; step < n - 1; ++step) {
      logs[static_cast<size_t>(r)].push_back(StepRecord{"rs", ring_next(r, n), ring_rs_send_block(r, step, n), 8,
                                                        ring_prev(r, n), ring_rs_recv_block(r, step, n), 8,
                                                        !copy_in_reduce_scatter});
    }
    for (int step = 0; step < n - 1; ++step) {
      logs[static_cast<size_t>(r)].push_back(StepRecord{"ag", ring_next(r, n), ring_ag_send_block(r, step, n), 8,
                                                        ring_prev(r, n), ring_ag_recv_block(r, step, n), 8, false});
    }
  }
  return logs;
}

TEST(TeachContents, RingAllReduceBuildsThePartialSums) {
  const Logs logs = real_ring_logs(3, false);
  const Contents contents = format_contents({CollectiveKind::kAllReduce, 6, 4, 0}, logs, logical_rounds(logs));
  // Round 1: each rank r sends its block r-1 to r+1, so r0 receives r2's block 1 (b) and adds it to its own.
  EXPECT_NE(contents.text.find("after round 1:\n  r0 [a0 | b0+b2 | c0]"), std::string::npos) << contents.text;
  EXPECT_NE(contents.text.find("after round 4:\n  r0 [a0+a1+a2 | b0+b1+b2 | c0+c1+c2]"), std::string::npos)
      << contents.text;
  EXPECT_EQ(contents.verdict, "");
}

TEST(TeachContents, EightRanksWriteRunsOfRanksByTheirEnds) {
  // Ring all-reduce on 8 ranks, 16 floats (blocks of 2): after the 7 reduce-scatter rounds r0's block a holds every
  // rank's input and its block b all but r1's (r1 sends b first, to r2, and the sum comes round to r0 without it).
  // Written out, the longest line would be 212 characters; runs of three or more consecutive ranks are written by
  // their ends, and every line of this view fits in 110 columns.
  const Logs logs = real_ring_logs(8, false);
  const Contents contents = format_contents({CollectiveKind::kAllReduce, 16, 4, 0}, logs, logical_rounds(logs));
  EXPECT_NE(
      contents.text.find(
          "after round 7:\n  r0 [a0..a7 | b0+b2..b7 | c0+c3..c7 | d0+d4..d7 | e0+e5..e7 | f0+f6+f7 | g0+g7 | h0]"),
      std::string::npos)
      << contents.text;
  // Two consecutive ranks stay a sum; the rounds' last line: every block summed over all 8.
  EXPECT_NE(contents.text.find(
                "after round 14:\n  r0 [a0..a7 | b0..b7 | c0..c7 | d0..d7 | e0..e7 | f0..f7 | g0..g7 | h0..h7]"),
            std::string::npos)
      << contents.text;
  size_t start = 0;
  for (size_t end = contents.text.find('\n'); end != std::string::npos; end = contents.text.find('\n', start)) {
    EXPECT_LE(end - start, 110u) << contents.text.substr(start, end - start);
    start = end + 1;
  }
  EXPECT_EQ(contents.verdict, "");
}

TEST(TeachContents, AnAllReduceThatCopiesInsteadOfAddingIsCaught) {
  const Logs logs = real_ring_logs(3, true);
  const Contents contents = format_contents({CollectiveKind::kAllReduce, 6, 4, 0}, logs, logical_rounds(logs));
  EXPECT_NE(contents.verdict.find("the collective leaves a0+a1+a2"), std::string::npos) << contents.verdict;
}

TEST(TeachContents, ABroadcastLeavesTheRootsInputEverywhere) {
  const Logs logs = tree_logs(8);
  const Contents contents = format_contents({CollectiveKind::kBroadcast, 4, 4, 0}, logs, logical_rounds(logs));
  EXPECT_NE(contents.text.find("after round 1:\n  r0 [a0]\n  r1 [·]"), std::string::npos) << contents.text;
  EXPECT_EQ(contents.verdict, "");
  // Read as a broadcast from r1, the same exchanges leave r1's data nowhere.
  EXPECT_NE(format_contents({CollectiveKind::kBroadcast, 4, 4, 1}, logs, logical_rounds(logs)).verdict, "");
}

TEST(TeachContents, FramesCarryTheMessagesTheTextShows) {
  // Round 1 of a ring all-reduce on 3 ranks: r0 sends block 2 to r1, r1 block 0 to r2, r2 block 1 to r0, each
  // added; the frames start from the inputs (round 0) and end with every block complete.
  const Logs logs = real_ring_logs(3, false);
  const Replay replay = replay_contents({CollectiveKind::kAllReduce, 6, 4, 0}, logs, logical_rounds(logs));
  ASSERT_EQ(replay.frames.size(), 5u);
  EXPECT_EQ(replay.frames[0].blocks[1], (std::vector<std::string>{"a1", "b1", "c1"}));
  ASSERT_EQ(replay.frames[1].messages.size(), 3u);
  const Message& first = replay.frames[1].messages[0];  // received by r0
  EXPECT_EQ(first.from, 2);
  EXPECT_EQ(first.to, 0);
  EXPECT_EQ(first.chunk, "block 1 (8 B)");
  EXPECT_TRUE(first.reduced);
  EXPECT_EQ(replay.frames[1].stages, "rs");
  EXPECT_EQ(replay.frames[4].blocks[2], (std::vector<std::string>{"a0+a1+a2", "b0+b1+b2", "c0+c1+c2"}));
}

TEST(TeachContents, AnExchangeWithNeitherBlockNorOffsetMustBeTheWholeBuffer) {
  // A broadcast's exchanges of the whole 16-byte buffer are placed at 0; one of 8 bytes with neither a block nor an
  // offset cannot be placed, and the view says which instead of drawing it at offset 0.
  Logs logs = tree_logs(4);
  EXPECT_EQ(format_contents({CollectiveKind::kBroadcast, 4, 4, 0}, logs, logical_rounds(logs)).error, "");
  logs[0][0].send_bytes = 8;
  logs[2][0].recv_bytes = 8;
  const Contents contents = format_contents({CollectiveKind::kBroadcast, 4, 4, 0}, logs, logical_rounds(logs));
  EXPECT_EQ(contents.text, "");
  EXPECT_EQ(contents.error,
            "r0's exchange 1 (send) sends 8 B with neither a block nor an offset, and the buffer is 16 B");
  // The same 8 bytes logged at an offset are placed there.
  logs[0][0].send_offset = 2;
  logs[2][0].recv_offset = 2;
  const Contents placed = format_contents({CollectiveKind::kBroadcast, 4, 4, 0}, logs, logical_rounds(logs));
  EXPECT_EQ(placed.error, "");
  EXPECT_NE(placed.text.find("  r2 [{·, a0}]"), std::string::npos) << placed.text;
}

TEST(TeachCost, ExecutedRingMatchesItsClosedForm) {
  // 5 ranks exchanging 8-byte blocks: S = 40 B, 2(N-1) = 8 rounds, 8 exchanges of 8 B = 2·4/5·40 on every rank,
  // 4 of them added = 4/5·40.
  const Logs logs = ring_logs(5);
  const ExecutedCost executed = executed_cost(logs, logical_rounds(logs));
  EXPECT_EQ(executed.rounds, 8);
  EXPECT_EQ(executed.bytes, 64u);
  EXPECT_EQ(executed.reduced, 32u);
  const Cost ring{8, 64, 32, "ring"};
  EXPECT_EQ(cost_disagreement(ring, executed, 4), "");
  // A model with the rounds of one half only, or with the bytes of the whole buffer per round, is caught.
  EXPECT_NE(cost_disagreement(Cost{4, 64, 32, "half"}, executed, 4).find("rounds: 8 executed, 4"), std::string::npos);
  EXPECT_NE(cost_disagreement(Cost{8, 320, 32, "S per round"}, executed, 4).find("critical path"), std::string::npos);
}

TEST(TeachCost, ABroadcastTreeIsBoundByItsRoot) {
  // The root of a binomial broadcast over 8 sends 16 B in each of 3 rounds; every other rank moves less.
  const Logs logs = tree_logs(8);
  const ExecutedCost executed = executed_cost(logs, logical_rounds(logs));
  EXPECT_EQ(executed.rounds, 3);
  EXPECT_EQ(executed.bytes, 48u);
  EXPECT_EQ(executed.reduced, 0u);
}

}  // namespace
}  // namespace emu::coll::teach
