// Shard arithmetic, DDP bucket assignment and the shrinking of full-scale sizes.
#include <gtest/gtest.h>

#include <vector>

#include "strategies/buckets.h"
#include "strategies/shard.h"
#include "strategies/strategy.h"

namespace emu::strategy {
namespace {

TEST(Shard, PadsToAMultipleOfRanksAndCoversEveryElementOnce) {
  for (size_t numel : {0u, 1u, 7u, 10u, 12u, 1031u}) {
    for (int ranks : {1, 2, 3, 4, 5, 8}) {
      size_t covered = 0;
      for (int r = 0; r < ranks; ++r) {
        const ShardInfo s = shard_of(numel, r, ranks);
        EXPECT_EQ(s.padded % static_cast<size_t>(ranks), 0u);
        EXPECT_LT(s.padded - numel, static_cast<size_t>(ranks)) << "less than one element of padding per rank";
        EXPECT_EQ(s.offset, covered < numel ? covered : s.offset);
        covered += s.valid;
      }
      EXPECT_EQ(covered, numel) << numel << " over " << ranks;
    }
  }
}

TEST(Shard, TheWorkedExample) {
  const ShardInfo last = shard_of(10, 3, 4);
  EXPECT_EQ(last.padded, 12u);
  EXPECT_EQ(last.shard, 3u);
  EXPECT_EQ(last.offset, 9u);
  EXPECT_EQ(last.valid, 1u);
  EXPECT_EQ(last.padding(), 2u);
  size_t lo = 0, hi = 0;
  shard_of(10, 1, 4).intersect(2, 5, lo, hi);
  EXPECT_EQ(lo, 3u);
  EXPECT_EQ(hi, 5u);
  shard_of(10, 0, 4).intersect(5, 8, lo, hi);
  EXPECT_EQ(lo, hi);
}

TEST(Buckets, ReverseOrderSmallFirstBucketParamsNeverSplit) {
  // Registration order sizes; DDP walks them backwards.
  const std::vector<size_t> sizes = {400, 300, 300, 200, 100, 600};
  const auto buckets = assign_buckets(sizes, 500, 1000);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].params, (std::vector<size_t>{5}));  // 600 >= 500 closes the first bucket
  EXPECT_EQ(buckets[0].bytes, 600u);
  EXPECT_EQ(buckets[1].params, (std::vector<size_t>{4, 3, 2, 1, 0}));  // 100+200+300+300 = 900 < 1000, +400
  EXPECT_EQ(buckets[1].bytes, 1300u);
}

TEST(Buckets, EveryParameterInExactlyOneBucket) {
  std::vector<size_t> sizes;
  for (size_t i = 0; i < 50; ++i) sizes.push_back(37 * (i % 7) + 5);
  const auto buckets = assign_buckets(sizes, 64, 256);
  std::vector<int> seen(sizes.size(), 0);
  for (const Bucket& b : buckets) {
    for (size_t p : b.params) ++seen[p];
  }
  for (int count : seen) EXPECT_EQ(count, 1);
  for (size_t i = 0; i + 1 < buckets.size(); ++i) EXPECT_GE(buckets[i].bytes, i == 0 ? 64u : 256u);
}

// A memory term shrinks by k² (docs/architecture.md), and so do the full-scale sizes that bound one: DDP's 25 MB
// bucket at k = 4 is 25'000'000 / 16 = 1'562'500 bytes, not 25'000'000 / 4. A size never shrinks to nothing.
TEST(Scaled, FullScaleSizesShrinkByKSquared) {
  StrategyOptions options;
  options.shrink = 4;
  EXPECT_EQ(options.scaled(25'000'000), 1'562'500u);
  EXPECT_EQ(options.scaled(100'000), 6'250u);  // ZeRO-3's persistence threshold at k = 4
  options.shrink = 8;
  EXPECT_EQ(options.scaled(500'000'000), 7'812'500u);  // DeepSpeed's reduce bucket at k = 8
  EXPECT_EQ(options.scaled(63), 1u);
  options.shrink = 1;
  EXPECT_EQ(options.scaled(25'000'000), 25'000'000u);
}

}  // namespace
}  // namespace emu::strategy
