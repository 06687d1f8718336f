// The caching allocator against PyTorch's documented rules (c10/cuda/CUDACachingAllocator.cpp, the "CUDA memory
// management" notes): every expected value below is hand arithmetic from those rules, stated beside it.
#include "emu/caching_allocator.h"

#include <gtest/gtest.h>

#include <vector>

#include "emu/check.h"

namespace emu {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kUnlimited = ~0ull;

CachingAllocator plain(uint64_t limit = kUnlimited) { return CachingAllocator(AllocatorConfig{}, limit); }

TEST(CachingAllocator, OneByteTakesA512ByteBlockOfATwoMiBSegment) {
  CachingAllocator a = plain();
  const auto block = a.allocate(1);
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(a.block_size(*block), 512u) << "sizes round up to kMinBlockSize = 512 B";
  EXPECT_EQ(a.allocated(), 512u);
  EXPECT_EQ(a.reserved(), 2 * kMiB) << "<= 1 MiB: small pool, 2 MiB segments";
  // A second small request is packed into the same segment: 513 B rounds to 1024 B.
  ASSERT_TRUE(a.allocate(513).has_value());
  EXPECT_EQ(a.allocated(), 512u + 1024u);
  EXPECT_EQ(a.reserved(), 2 * kMiB);
  EXPECT_EQ(a.segments(), 1u);
}

TEST(CachingAllocator, SegmentSizesFollowTheRequest) {
  CachingAllocator a = plain();
  ASSERT_TRUE(a.allocate(11 * kMiB).has_value());
  EXPECT_EQ(a.reserved(), 12 * kMiB) << ">= 10 MiB: the request rounded up to 2 MiB, 11 -> 12 MiB";
  ASSERT_TRUE(a.allocate(3 * kMiB).has_value());
  EXPECT_EQ(a.reserved(), 12 * kMiB + 20 * kMiB) << "1 MiB < 3 MiB < 10 MiB: a 20 MiB segment";
  // The 3 MiB block split its segment (17 MiB left > 1 MiB), so a 17 MiB request needs no new segment.
  ASSERT_TRUE(a.allocate(17 * kMiB).has_value());
  EXPECT_EQ(a.reserved(), 32 * kMiB);
  EXPECT_EQ(a.segments(), 2u);
}

TEST(CachingAllocator, LargeRemaindersSplitOnlyAboveOneMiB) {
  CachingAllocator a = plain();
  // 11 MiB in a 12 MiB segment leaves exactly 1 MiB: not > kSmallSize, so the whole segment is the block.
  const auto whole = a.allocate(11 * kMiB);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(a.block_size(*whole), 12 * kMiB);
  EXPECT_EQ(a.allocated(), 12 * kMiB);
  // 10.5 MiB in a 12 MiB segment leaves 1.5 MiB: split, and a 1.5 MiB request takes the rest.
  const auto split = a.allocate(10 * kMiB + kMiB / 2);
  ASSERT_TRUE(split.has_value());
  EXPECT_EQ(a.block_size(*split), 10 * kMiB + kMiB / 2);
  ASSERT_TRUE(a.allocate(kMiB + kMiB / 2).has_value());
  EXPECT_EQ(a.reserved(), 24 * kMiB);
}

TEST(CachingAllocator, FreedBlocksAreCachedAndReused) {
  CachingAllocator a = plain();
  const auto first = a.allocate(40 * kMiB);
  ASSERT_TRUE(first.has_value());
  a.free(*first);
  EXPECT_EQ(a.allocated(), 0u);
  EXPECT_EQ(a.reserved(), 40 * kMiB) << "a freed block stays reserved, cached";
  ASSERT_TRUE(a.allocate(40 * kMiB).has_value());
  EXPECT_EQ(a.reserved(), 40 * kMiB) << "the same size again: the cached block, no new segment";
  EXPECT_EQ(a.segments(), 1u);
}

TEST(CachingAllocator, BestFitTakesTheSmallestCachedBlock) {
  CachingAllocator a = plain();
  const auto big = a.allocate(60 * kMiB);
  const auto small = a.allocate(30 * kMiB);
  ASSERT_TRUE(big && small);
  a.free(*big);
  a.free(*small);
  // 30 MiB fits both cached blocks; best fit takes the 30 MiB one, so 60 MiB is then served without a new segment.
  ASSERT_TRUE(a.allocate(30 * kMiB).has_value());
  ASSERT_TRUE(a.allocate(60 * kMiB).has_value());
  EXPECT_EQ(a.reserved(), 90 * kMiB);
}

TEST(CachingAllocator, BlocksMergeOnlyWithinTheirSegment) {
  CachingAllocator a = plain();
  // 6 + 8 MiB share one 20 MiB segment (6 MiB left); the second 8 MiB needs a second 20 MiB segment.
  const auto x = a.allocate(6 * kMiB);
  const auto y = a.allocate(8 * kMiB);
  const auto z = a.allocate(8 * kMiB);
  ASSERT_TRUE(x && y && z);
  ASSERT_EQ(a.reserved(), 40 * kMiB);
  a.free(*x);
  a.free(*y);
  a.free(*z);
  // Each segment merged back to one free 20 MiB block, but the two never join: 30 MiB needs a 30 MiB segment.
  ASSERT_TRUE(a.allocate(30 * kMiB).has_value());
  EXPECT_EQ(a.reserved(), 70 * kMiB);
}

// Nine 6 MiB tensors fill three 20 MiB segments (6 + 6 + 6 + 2 free each) = 60 MiB, the whole limit. Every other
// one is freed: the largest free hole is 8 MiB (the third tensor of a segment merged with its 2 MiB tail).
// Allocated is 4 x 6 = 24 MiB, so 24 + 12 = 36 MiB <= 60 MiB would fit exactly, but the caching allocator needs a
// 12 MiB segment (60 + 12 > 60) and every cached block is part of a split segment, so freeing the cache frees
// nothing: out of memory through fragmentation alone.
TEST(CachingAllocator, FragmentationAloneRunsOutOfMemory) {
  CachingAllocator a = plain(60 * kMiB);
  std::vector<CachingAllocator::BlockId> blocks;
  for (int i = 0; i < 9; ++i) {
    const auto block = a.allocate(6 * kMiB);
    ASSERT_TRUE(block.has_value()) << i;
    blocks.push_back(*block);
  }
  ASSERT_EQ(a.reserved(), 60 * kMiB);
  for (size_t i = 0; i < blocks.size(); i += 2) a.free(blocks[i]);
  ASSERT_EQ(a.allocated(), 24 * kMiB);
  EXPECT_LE(a.allocated() + 12 * kMiB, a.limit()) << "an exact count would fit it";
  EXPECT_FALSE(a.allocate(12 * kMiB).has_value());
  EXPECT_EQ(a.reserved(), 60 * kMiB) << "nothing cached could be released";
  // An 8 MiB request still fits a hole.
  EXPECT_TRUE(a.allocate(8 * kMiB).has_value());
}

// A 30 MiB tensor is freed and cached; a 32 MiB one cannot use it and 30 + 32 > 40 MiB. PyTorch frees the cached
// unsplit segment and retries: 32 MiB fits.
TEST(CachingAllocator, FreeAndRetryReleasesCachedSegments) {
  CachingAllocator a = plain(40 * kMiB);
  const auto first = a.allocate(30 * kMiB);
  ASSERT_TRUE(first.has_value());
  a.free(*first);
  ASSERT_TRUE(a.allocate(32 * kMiB).has_value());
  EXPECT_EQ(a.reserved(), 32 * kMiB);
  EXPECT_EQ(a.segments(), 1u);
}

// Three 12 MiB tensors take three 12 MiB segments (36 MiB); a 4 MiB one needs a 20 MiB segment: 56 > 40 MiB, out
// of memory, though 36 + 4 = 40 MiB. With expandable segments the large pool maps 20 MiB pages into one segment:
// 36 MiB of tensors sit in two pages (40 MiB) and the 4 MiB tensor fits the rest of the second page.
TEST(CachingAllocator, ExpandableSegmentsRescueWhatSegmentsStrand) {
  CachingAllocator plain_allocator = plain(40 * kMiB);
  AllocatorConfig expandable;
  expandable.expandable_segments = true;
  CachingAllocator grown(expandable, 40 * kMiB);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(plain_allocator.allocate(12 * kMiB).has_value());
    ASSERT_TRUE(grown.allocate(12 * kMiB).has_value());
  }
  EXPECT_EQ(plain_allocator.reserved(), 36 * kMiB);
  EXPECT_EQ(grown.reserved(), 40 * kMiB) << "two 20 MiB pages";
  EXPECT_FALSE(plain_allocator.allocate(4 * kMiB).has_value());
  EXPECT_TRUE(grown.allocate(4 * kMiB).has_value());
  EXPECT_EQ(grown.reserved(), 40 * kMiB);
  EXPECT_EQ(grown.segments(), 1u);
}

// Expandable segments unmap free pages before giving up: a 40 MiB tensor (two pages) freed, then 60 MiB under a
// 60 MiB limit: the free pages are unmapped and three are mapped again.
TEST(CachingAllocator, ExpandableSegmentsUnmapFreePagesBeforeOutOfMemory) {
  AllocatorConfig expandable;
  expandable.expandable_segments = true;
  CachingAllocator a(expandable, 60 * kMiB);
  const auto small = a.allocate(1);
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(a.reserved(), 2 * kMiB) << "the small pool maps 2 MiB pages";
  const auto first = a.allocate(40 * kMiB);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(a.reserved(), 42 * kMiB);
  a.free(*first);
  // 40 MiB cached + 20 MiB more would be 62 > 60; the large pool's free pages go first, then 60 MiB are mapped.
  ASSERT_FALSE(a.allocate(60 * kMiB).has_value()) << "2 + 60 > 60 even with every free page unmapped";
  EXPECT_EQ(a.reserved(), 2 * kMiB) << "the failed attempt unmapped the free pages";
  a.free(*small);
  ASSERT_TRUE(a.allocate(60 * kMiB).has_value()) << "the small pool's page unmapped too: 60 <= 60";
  EXPECT_EQ(a.reserved(), 60 * kMiB);
}

TEST(CachingAllocator, MaxSplitSizeKeepsOversizeBlocksForOversizeRequests) {
  AllocatorConfig config = AllocatorConfig::parse("max_split_size_mb:64");
  ASSERT_EQ(config.max_split_size, 64 * kMiB);
  CachingAllocator a(config, kUnlimited);
  const auto big = a.allocate(100 * kMiB);
  ASSERT_TRUE(big.has_value());
  a.free(*big);
  // 50 MiB < 64 MiB may not take the oversize 100 MiB block: a new 50 MiB segment.
  const auto mid = a.allocate(50 * kMiB);
  ASSERT_TRUE(mid.has_value());
  EXPECT_EQ(a.reserved(), 150 * kMiB);
  // 79 MiB >= 64 MiB may take an oversize block only under 79 + 20 = 99 MiB: not the 100 MiB one.
  const auto large = a.allocate(79 * kMiB);
  ASSERT_TRUE(large.has_value());
  EXPECT_EQ(a.reserved(), 230 * kMiB) << "79 MiB rounds to an 80 MiB segment";
  a.free(*large);
  // 81 MiB: the cached 80 MiB is too small, the 100 MiB block is under 81 + 20 and is taken whole (not split).
  const auto whole = a.allocate(81 * kMiB);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(a.block_size(*whole), 100 * kMiB);
  EXPECT_EQ(a.reserved(), 230 * kMiB);
}

TEST(CachingAllocator, MaxSplitSizeReleasesOversizeBlocksFirst) {
  CachingAllocator a(AllocatorConfig::parse("max_split_size_mb:64"), 150 * kMiB);
  const auto big = a.allocate(100 * kMiB);
  const auto small = a.allocate(1);  // keeps a small segment alive
  ASSERT_TRUE(big && small);
  a.free(*big);
  // 70 MiB may not take the 100 MiB block (>= 70 + 20); 102 + 70 > 150, so the oversize block is released first.
  ASSERT_TRUE(a.allocate(70 * kMiB).has_value());
  EXPECT_EQ(a.reserved(), 72 * kMiB);
}

TEST(AllocatorConfig, ParsesPyTorchSyntax) {
  const AllocatorConfig config = AllocatorConfig::parse("expandable_segments:True, max_split_size_mb:128");
  EXPECT_TRUE(config.expandable_segments);
  EXPECT_EQ(config.max_split_size, 128 * kMiB);
  EXPECT_EQ(config.str(), "expandable_segments:True,max_split_size_mb:128");
  EXPECT_EQ(AllocatorConfig::parse("").str(), "");
  EXPECT_FALSE(AllocatorConfig::parse("expandable_segments:False").expandable_segments);
}

TEST(AllocatorConfig, RejectsBadKeysAndValuesNamingTheAcceptedOnes) {
  for (const char* bad : {"expandable_segments:true", "max_split_size_mb:20", "max_split_size_mb:abc",
                          "garbage_collection_threshold:0.6", "expandable_segments", "max_split_size_mb:64;"}) {
    try {
      AllocatorConfig::parse(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(bad), std::string::npos) << message;
      EXPECT_NE(message.find("expandable_segments:True|False, max_split_size_mb:N (N > 20)"), std::string::npos)
          << message;
    }
  }
}

}  // namespace
}  // namespace emu
