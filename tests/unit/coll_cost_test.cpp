// The α-β-γ cost model against hand arithmetic: Hockney's model as Thakur, Rabenseifner and Gropp (2005) apply it
// to the ring, binomial-tree and halving-doubling algorithms, nccl-tests' bus-bandwidth relation, the crossover
// between a latency-bound and a bandwidth-bound all-reduce, and the fit recovering a known link.
#include <gtest/gtest.h>

#include <cmath>

#include "collectives/cost.h"

namespace emu::coll {

extern const Algorithm kRingAllReduce, kRhdAllReduce, kTreeAllReduce, kDbtreeAllReduce, kRingReduceScatter,
    kRingAllGather, kTreeBroadcast, kTreeReduce, kPairwiseAllToAll, kDisseminationBarrier;

namespace {

constexpr double kGiBytes = 1024.0 * 1024 * 1024;

TEST(CollCost, RingAllReduceOnEightGpus) {
  // 1 GiB over 8 ranks on a link of α = 5 µs, 150 GB/s, reduction free: 14 rounds of latency (70 µs) and
  // 2·7/8 GiB = 1,879,048,192 B at 150 GB/s (12.5270 ms).
  const LinkModel link{5e-6, 1 / 150e9, 0};
  const double t = predicted_seconds(kRingAllReduce.cost(kGiBytes, 8), link);
  EXPECT_NEAR(t, 70e-6 + 1879048192.0 / 150e9, 1e-9);
  // nccl-tests' busbw = S/t · 2(N-1)/N: the link's bandwidth, less the latency's share.
  const double busbw = kGiBytes / t * 2 * 7 / 8;
  EXPECT_NEAR(busbw / 150e9, 1.0, 0.01);
}

TEST(CollCost, RoundsOfEachAlgorithm) {
  // Ring: N-1 per half; binomial trees: ceil(log2 N) (5 → 3, 8 → 3, 9 → 4); halving-doubling: 2 log2 N on powers
  // of two, two more to fold the extra ranks in and out otherwise (6 → 2·2 + 2).
  EXPECT_EQ(kRingAllReduce.cost(1, 5).rounds, 8);
  EXPECT_EQ(kRingReduceScatter.cost(1, 5).rounds, 4);
  EXPECT_EQ(kRingAllGather.cost(1, 5).rounds, 4);
  EXPECT_EQ(kPairwiseAllToAll.cost(1, 5).rounds, 4);
  EXPECT_EQ(kTreeBroadcast.cost(1, 5).rounds, 3);
  EXPECT_EQ(kTreeBroadcast.cost(1, 8).rounds, 3);
  EXPECT_EQ(kTreeReduce.cost(1, 9).rounds, 4);
  EXPECT_EQ(kTreeAllReduce.cost(1, 8).rounds, 6);
  EXPECT_EQ(kDisseminationBarrier.cost(0, 5).rounds, 3);
  EXPECT_EQ(kRhdAllReduce.cost(1, 8).rounds, 6);
  EXPECT_EQ(kRhdAllReduce.cost(1, 6).rounds, 6);
  EXPECT_EQ(kRingAllReduce.cost(1, 1).rounds, 0);
}

TEST(CollCost, BytesOnTheCriticalPath) {
  const double s = 1e6;
  EXPECT_DOUBLE_EQ(kRingAllReduce.cost(s, 4).bytes, 1.5e6);  // 2·3/4 S
  EXPECT_DOUBLE_EQ(kRingAllReduce.cost(s, 4).reduced, 0.75e6);
  EXPECT_DOUBLE_EQ(kRhdAllReduce.cost(s, 4).bytes, 1.5e6);  // the ring's volume on a power of two
  EXPECT_DOUBLE_EQ(kRhdAllReduce.cost(s, 6).bytes, 3.5e6);  // 2·3/4 S over p = 4, plus S in and S out
  EXPECT_DOUBLE_EQ(kRhdAllReduce.cost(s, 6).reduced, 1.75e6);
  EXPECT_DOUBLE_EQ(kTreeBroadcast.cost(s, 8).bytes, 3e6);  // the root sends S in each of 3 rounds
  EXPECT_DOUBLE_EQ(kTreeBroadcast.cost(s, 8).reduced, 0);
  EXPECT_DOUBLE_EQ(kTreeAllReduce.cost(s, 8).bytes, 6e6);
  EXPECT_DOUBLE_EQ(kTreeAllReduce.cost(s, 8).reduced, 3e6);
  EXPECT_DOUBLE_EQ(kRingAllGather.cost(s, 8).bytes, 0.875e6);
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
  const auto at = [&](const Algorithm& a, double s) { return predicted_seconds(a.cost(s, 8), link); };
  EXPECT_LT(at(kTreeAllReduce, 1e5), at(kRingAllReduce, 1e5));
  EXPECT_GT(at(kTreeAllReduce, 1e6), at(kRingAllReduce, 1e6));
}

TEST(CollCost, DoubleBinaryTreeSitsBetweenTreeAndRing) {
  // 8 ranks: the top inner level is 2 (rank 4 of tree 0), so one chunk climbs in 5 steps and descends in 5; the
  // busiest rank makes 8 one-way moves of S/2 and adds two halves. dbtree: 10α + S(4β + γ).
  EXPECT_EQ(kDbtreeAllReduce.cost(1, 8).rounds, 10);
  EXPECT_EQ(kDbtreeAllReduce.cost(1, 9).rounds, 14);  // rank 8's level 3
  EXPECT_EQ(kDbtreeAllReduce.cost(1, 2).rounds, 2);
  EXPECT_DOUBLE_EQ(kDbtreeAllReduce.cost(1e6, 8).bytes, 4e6);
  EXPECT_DOUBLE_EQ(kDbtreeAllReduce.cost(1e6, 8).reduced, 1e6);
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

TEST(CollCost, FitRecoversAKnownLink) {
  const LinkModel truth{7e-6, 1 / 12e9, 1 / 30e9};
  std::vector<Sample> samples;
  for (const Algorithm* a : {&kRingAllReduce, &kTreeAllReduce, &kRingReduceScatter, &kRingAllGather}) {
    for (double s = 1024; s <= 64e6; s *= 8) {
      const Cost cost = a->cost(s, 8);
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
    const Cost cost = kRingAllReduce.cost(s, 8);
    samples.push_back({cost, cost.rounds * 2e-6 + cost.bytes / 10e9 - cost.reduced / 100e9});
  }
  const Fit fit = fit_link(samples);
  EXPECT_GE(fit.link.alpha, 0);
  EXPECT_GE(fit.link.beta, 0);
  EXPECT_GE(fit.link.gamma, 0);
}

}  // namespace
}  // namespace emu::coll
