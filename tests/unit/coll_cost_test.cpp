// The α-β-γ cost model against hand arithmetic: Hockney's model as Thakur, Rabenseifner and Gropp (2005) apply it
// to the ring, binomial-tree and halving-doubling algorithms, nccl-tests' bus-bandwidth relation, the crossover
// between a latency-bound and a bandwidth-bound all-reduce, and the fit recovering a known link.
#include <gtest/gtest.h>

#include <cmath>

#include "collectives/cost.h"

namespace emu::coll {

extern const Algorithm kRingAllReduce, kRhdAllReduce, kTreeAllReduce, kDbtreeAllReduce, kHierAllReduce,
    kRingReduceScatter, kRingAllGather, kTreeBroadcast, kRingReduce, kTreeReduce, kPairwiseAllToAll,
    kDisseminationBarrier;

namespace {

constexpr double kGiBytes = 1024.0 * 1024 * 1024;

TEST(CollCost, RingAllReduceOnEightGpus) {
  // 1 GiB over 8 ranks on a link of α = 5 µs, 150 GB/s, reduction free: 14 rounds of latency (70 µs) and
  // 2·7/8 GiB = 1,879,048,192 B at 150 GB/s (12.5270 ms).
  const LinkModel link{5e-6, 1 / 150e9, 0};
  const double t = predicted_seconds(kRingAllReduce.cost(kGiBytes, 8, 0), link);
  EXPECT_NEAR(t, 70e-6 + 1879048192.0 / 150e9, 1e-9);
  // nccl-tests' busbw = S/t · 2(N-1)/N: the link's bandwidth, less the latency's share.
  const double busbw = kGiBytes / t * 2 * 7 / 8;
  EXPECT_NEAR(busbw / 150e9, 1.0, 0.01);
}

TEST(CollCost, RoundsOfEachAlgorithm) {
  // Ring: N-1 per half; binomial trees: ceil(log2 N) (5 → 3, 8 → 3, 9 → 4); halving-doubling: 2 log2 N on powers
  // of two, two more to fold the extra ranks in and out otherwise (6 → 2·2 + 2).
  EXPECT_EQ(kRingAllReduce.cost(1, 5, 0).rounds, 8);
  EXPECT_EQ(kRingReduceScatter.cost(1, 5, 0).rounds, 4);
  EXPECT_EQ(kRingAllGather.cost(1, 5, 0).rounds, 4);
  EXPECT_EQ(kPairwiseAllToAll.cost(1, 5, 0).rounds, 4);
  EXPECT_EQ(kTreeBroadcast.cost(1, 5, 0).rounds, 3);
  EXPECT_EQ(kTreeBroadcast.cost(1, 8, 0).rounds, 3);
  EXPECT_EQ(kTreeReduce.cost(1, 9, 0).rounds, 4);
  EXPECT_EQ(kTreeAllReduce.cost(1, 8, 0).rounds, 6);
  EXPECT_EQ(kDisseminationBarrier.cost(0, 5, 0).rounds, 3);
  EXPECT_EQ(kRhdAllReduce.cost(1, 8, 0).rounds, 6);
  EXPECT_EQ(kRhdAllReduce.cost(1, 6, 0).rounds, 6);
  EXPECT_EQ(kRingAllReduce.cost(1, 1, 0).rounds, 0);
}

// The ring reduce's chain pipelines its pieces, as NCCL's does: 1 GiB over 8 ranks in 4 MiB pieces (k = 256) takes
// N+k−2 = 262 rounds, and a middle rank's links carry S plus one piece (S/k), where one piece would take 7 rounds
// and 2S: nccl-tests' reduce bus bandwidth (factor 1) tends to the link's as S grows. It then beats the ring
// all-reduce it replaces (2·7/8 S), which one piece would not.
TEST(CollCost, RingReducePipelinesItsPieces) {
  const double slice = 4.0 * 1024 * 1024;
  const Cost one = kRingReduce.cost(kGiBytes, 8, 0);
  EXPECT_EQ(one.rounds, 7);
  EXPECT_DOUBLE_EQ(one.bytes, 2 * kGiBytes);
  const Cost pieces = kRingReduce.sliced_cost(kGiBytes, 8, 0, slice);
  EXPECT_EQ(pieces.rounds, 262);
  EXPECT_DOUBLE_EQ(pieces.bytes, kGiBytes + slice);
  EXPECT_DOUBLE_EQ(pieces.reduced, kGiBytes);
  EXPECT_DOUBLE_EQ(kRingReduce.sliced_cost(kGiBytes, 2, 0, slice).bytes, kGiBytes);  // no middle rank
  EXPECT_EQ(kRingReduce.sliced_cost(kGiBytes, 2, 0, slice).rounds, 256);
  const LinkModel link{5e-6, 1 / 150e9, 0};
  const double t = predicted_seconds(pieces, link);
  EXPECT_NEAR(t, 262 * 5e-6 + (kGiBytes + slice) / 150e9, 1e-9);  // 1.31 ms of latency beside 7.19 ms
  EXPECT_LT(t, predicted_seconds(kRingAllReduce.cost(kGiBytes, 8, 0), link));
  EXPECT_GT(predicted_seconds(one, link), predicted_seconds(kRingAllReduce.cost(kGiBytes, 8, 0), link));
}

TEST(CollCost, BytesOnTheCriticalPath) {
  const double s = 1e6;
  EXPECT_DOUBLE_EQ(kRingAllReduce.cost(s, 4, 0).bytes, 1.5e6);  // 2·3/4 S
  EXPECT_DOUBLE_EQ(kRingAllReduce.cost(s, 4, 0).reduced, 0.75e6);
  EXPECT_DOUBLE_EQ(kRhdAllReduce.cost(s, 4, 0).bytes, 1.5e6);  // the ring's volume on a power of two
  EXPECT_DOUBLE_EQ(kRhdAllReduce.cost(s, 6, 0).bytes, 3.5e6);  // 2·3/4 S over p = 4, plus S in and S out
  EXPECT_DOUBLE_EQ(kRhdAllReduce.cost(s, 6, 0).reduced, 1.75e6);
  EXPECT_DOUBLE_EQ(kTreeBroadcast.cost(s, 8, 0).bytes, 3e6);  // the root sends S in each of 3 rounds
  EXPECT_DOUBLE_EQ(kTreeBroadcast.cost(s, 8, 0).reduced, 0);
  EXPECT_DOUBLE_EQ(kTreeAllReduce.cost(s, 8, 0).bytes, 6e6);
  EXPECT_DOUBLE_EQ(kTreeAllReduce.cost(s, 8, 0).reduced, 3e6);
  EXPECT_DOUBLE_EQ(kRingAllGather.cost(s, 8, 0).bytes, 0.875e6);
}

TEST(CollCost, TreeBeatsRingBelowTheCrossoverOnly) {
  // 8 ranks, α = 5 µs, 20 GB/s, reduction 40 GB/s. Tree: 6α + S(6β + 3γ); ring: 14α + S(1.75β + 0.875γ).
  // Equal where 8α = S(4.25β + 2.125γ): S = 40 µs / (4.25/20e9 + 2.125/40e9) s/B = 150,588.2 B.
  const LinkModel link{5e-6, 1 / 20e9, 1 / 40e9};
  const auto cross = crossover(kRingAllReduce, kTreeAllReduce, 8, link);
  ASSERT_TRUE(cross);
  EXPECT_NEAR(cross->payload, 40e-6 / (4.25 / 20e9 + 2.125 / 40e9), 1e-3);
  EXPECT_NEAR(cross->payload, 150588.2, 0.1);
  EXPECT_EQ(cross->below, &kTreeAllReduce);
  EXPECT_EQ(cross->above, &kRingAllReduce);
  const auto at = [&](const Algorithm& a, double s) { return predicted_seconds(a.cost(s, 8, 0), link); };
  EXPECT_LT(at(kTreeAllReduce, 1e5), at(kRingAllReduce, 1e5));
  EXPECT_GT(at(kTreeAllReduce, 1e6), at(kRingAllReduce, 1e6));
}

TEST(CollCost, DoubleBinaryTreeSitsBetweenTreeAndRing) {
  // 8 ranks: the top inner level is 2 (rank 4 of tree 0), so one chunk climbs in 5 steps and descends in 5; the
  // busiest rank makes 8 one-way moves of S/2 and adds two halves. dbtree: 10α + S(4β + γ).
  EXPECT_EQ(kDbtreeAllReduce.cost(1, 8, 0).rounds, 10);
  EXPECT_EQ(kDbtreeAllReduce.cost(1, 9, 0).rounds, 14);  // rank 8's level 3
  EXPECT_EQ(kDbtreeAllReduce.cost(1, 2, 0).rounds, 2);
  EXPECT_DOUBLE_EQ(kDbtreeAllReduce.cost(1e6, 8, 0).bytes, 4e6);
  EXPECT_DOUBLE_EQ(kDbtreeAllReduce.cost(1e6, 8, 0).reduced, 1e6);
  // Against the ring (14α + S(1.75β + 0.875γ)): 4α = S(2.25β + 0.125γ), S = 172,973.0 B at α 5 µs, 20 and 40 GB/s;
  // against the binomial tree (6α + S(6β + 3γ)): 4α = S(2β + 2γ), S = 133,333.3 B.
  const LinkModel link{5e-6, 1 / 20e9, 1 / 40e9};
  const auto ring = crossover(kRingAllReduce, kDbtreeAllReduce, 8, link);
  ASSERT_TRUE(ring);
  EXPECT_NEAR(ring->payload, 20e-6 / (2.25 / 20e9 + 0.125 / 40e9), 1e-3);
  EXPECT_EQ(ring->below, &kDbtreeAllReduce);
  const auto tree = crossover(kTreeAllReduce, kDbtreeAllReduce, 8, link);
  ASSERT_TRUE(tree);
  EXPECT_NEAR(tree->payload, 133333.3, 0.1);
  EXPECT_EQ(tree->below, &kTreeAllReduce);
}

TEST(CollCost, HalvingDoublingNeverLosesToTheRingOnAPowerOfTwo) {
  // The same bytes in fewer rounds: in this model rhd wins at every size on 8 ranks (the ring's advantage on real
  // machines is topology: its neighbours share the fast links, which the model does not see). On 6 ranks the
  // fold's extra bytes make the ring win for large payloads.
  const LinkModel link{5e-6, 1 / 20e9, 1 / 40e9};
  EXPECT_FALSE(crossover(kRingAllReduce, kRhdAllReduce, 8, link));
  const auto six = crossover(kRingAllReduce, kRhdAllReduce, 6, link);
  ASSERT_TRUE(six);
  EXPECT_EQ(six->below, &kRhdAllReduce);
  // 4α = S((3.5 - 5/3)β + (1.75 - 5/6)γ)
  EXPECT_NEAR(six->payload, 20e-6 / ((3.5 - 5.0 / 3) / 20e9 + (1.75 - 5.0 / 6) / 40e9), 1e-3);
}

// Two nodes of 4 ranks, NVLink-like within a node (α 2 µs, 300 GB/s) and a NIC-like network between them (α 10 µs,
// 25 GB/s), reduction free.
const Fabric kTwoLinks{{2e-6, 1 / 300e9, 0}, {10e-6, 1 / 25e9, 0}, 4, std::nullopt};

TEST(CollCost, HierarchicalAllReduceByHandOnTwoNodesOfFour) {
  // 1 GiB. Within the node, a ring reduce-scatter and all-gather over 4 ranks: 2·3 = 6 rounds and
  // 2·3/4 S = 1,610,612,736 B at 300 GB/s. Between the 2 nodes, each rank's quarter S/4 all-reduced over 2:
  // 2·1 = 2 rounds and 2·1/2 · S/4 = 268,435,456 B at 25 GB/s.
  const Cost hier = kHierAllReduce.cost(kGiBytes, 8, 4);
  EXPECT_EQ(hier.rounds, 8);
  EXPECT_EQ(hier.inter_rounds, 2);
  EXPECT_DOUBLE_EQ(hier.inter_bytes, 268435456.0);
  EXPECT_DOUBLE_EQ(hier.bytes, 1610612736.0 + 268435456.0);
  EXPECT_DOUBLE_EQ(hier.reduced, (0.75 + 0.125) * kGiBytes);  // 3/4 S within, 1/2 · S/4 between
  const double by_hand = 6 * 2e-6 + 1610612736.0 / 300e9 + 2 * 10e-6 + 268435456.0 / 25e9;  // 16.138 ms
  EXPECT_NEAR(predicted_seconds(hier, kTwoLinks, 8), by_hand, 1e-9);
  // The flat ring over the 8 ranks: every step waits on a message between the nodes, so all of it at the network:
  // 14 rounds and 2·7/8 S = 1,879,048,192 B at 25 GB/s, 75.30 ms, 4.7 times the hierarchical one.
  const double ring = predicted_seconds(kRingAllReduce.cost(kGiBytes, 8, 4), kTwoLinks, 8);
  EXPECT_NEAR(ring, 14 * 10e-6 + 1879048192.0 / 25e9, 1e-9);
  // Fewer rounds at the network and fewer bytes there: the ring is never faster on two nodes.
  EXPECT_FALSE(crossover(kRingAllReduce, kHierAllReduce, 8, kTwoLinks));
  // On one node (L = N) it is the ring, at the node's link.
  const Fabric one_node{kTwoLinks.node, kTwoLinks.network, 8, std::nullopt};
  EXPECT_DOUBLE_EQ(predicted_seconds(kHierAllReduce.cost(kGiBytes, 8, 8), one_node, 8),
                   predicted_seconds(kRingAllReduce.cost(kGiBytes, 8, 0), kTwoLinks.node));
}

TEST(CollCost, HierarchicalAllReduceLosesToATreeForSmallPayloadsOnManyNodes) {
  // 16 nodes of 8 (N = 128), the links above. hier: 2·7 = 14 rounds at 2 µs and 2·15 = 30 at 10 µs (328 µs), per
  // byte 2·7/8 / 300 GB/s + 2·15/16 · 1/8 / 25 GB/s. The binomial tree across nodes: 2·7 = 14 rounds at 10 µs (140 µs)
  // and 14 S at 25 GB/s. Equal where 188 µs = S (14/25e9 - 1.75/300e9 - 0.234375/25e9): S = 345,086 B.
  const Fabric many{kTwoLinks.node, kTwoLinks.network, 8, std::nullopt};
  const auto cross = crossover(kTreeAllReduce, kHierAllReduce, 128, many);
  ASSERT_TRUE(cross);
  EXPECT_EQ(cross->below, &kTreeAllReduce);
  EXPECT_EQ(cross->above, &kHierAllReduce);
  EXPECT_NEAR(cross->payload, 188e-6 / (14 / 25e9 - 1.75 / 300e9 - 0.234375 / 25e9), 1e-2);
}

TEST(CollCost, FitRecoversAKnownLink) {
  const LinkModel truth{7e-6, 1 / 12e9, 1 / 30e9};
  std::vector<Sample> samples;
  for (const Algorithm* a : {&kRingAllReduce, &kTreeAllReduce, &kRingReduceScatter, &kRingAllGather}) {
    for (double s = 1024; s <= 64e6; s *= 8) {
      const Cost cost = a->cost(s, 8, 0);
      samples.push_back({cost, predicted_seconds(cost, truth)});
    }
  }
  const Fit fit = fit_link(samples);
  EXPECT_NEAR(fit.link.alpha / truth.alpha, 1, 1e-6);
  EXPECT_NEAR(fit.link.beta / truth.beta, 1, 1e-6);
  EXPECT_NEAR(fit.link.gamma / truth.gamma, 1, 1e-6);
  for (double e : fit.relative_errors) EXPECT_NEAR(e, 0, 1e-6);
}

TEST(CollCost, FitKeepsEachTermNonNegative) {
  // Times that fall with size along the reduction term would need γ < 0: the fit drops the term instead.
  std::vector<Sample> samples;
  for (double s = 1024; s <= 64e6; s *= 8) {
    const Cost cost = kRingAllReduce.cost(s, 8, 0);
    samples.push_back({cost, cost.rounds * 2e-6 + cost.bytes / 10e9 - cost.reduced / 100e9});
  }
  const Fit fit = fit_link(samples);
  EXPECT_GE(fit.link.alpha, 0);
  EXPECT_GE(fit.link.beta, 0);
  EXPECT_GE(fit.link.gamma, 0);
}

}  // namespace
}  // namespace emu::coll
