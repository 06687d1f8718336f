// ZeRO-3's gathered parameters replayed tensor by tensor as DeepSpeed's PartitionedParameterCoordinator fetches,
// prefetches and releases them (strategies/zero3_modules.h), against traces worked by hand.
#include <gtest/gtest.h>

#include <vector>

#include "strategies/zero3_modules.h"

namespace emu::strategy {
namespace {

// Root: token table 100 (the embedding), final norm 4, head 100; one or two blocks of norm 4, b 30, c 50. Tensors
// of at most 4 elements are persistent.
Zero3ModuleInput small(int blocks) {
  Zero3ModuleInput in;
  in.tensors.push_back({100, 4, 100});
  for (int b = 0; b < blocks; ++b) in.tensors.push_back({4, 30, 50});
  in.embedding = {true, false, false};
  in.persistence = 4;
  in.max_live = 1'000'000;
  return in;
}

// No prefetch, no reuse: each tensor gathered for its use alone, the persistent norms from their first use on.
TEST(Zero3Modules, EachTensorForItsUseAlone) {
  const Zero3ModuleInput in = small(2);
  const Zero3Phases first = zero3_module_phases(in, false);
  EXPECT_EQ(first.forward, (std::vector<uint64_t>{100, 4 + 50, 8 + 50}));
  EXPECT_EQ(first.head_forward, 12u + 100);  // both block norms, the final norm and the head
  EXPECT_EQ(first.head_backward, 12u + 100);
  EXPECT_EQ(first.backward, (std::vector<uint64_t>{12 + 100, 12 + 50, 12 + 50}));
  EXPECT_EQ(first.after, 12u);
  EXPECT_EQ(first.kept, (std::vector<bool>{false, false, false}));
  EXPECT_EQ(first.max(), 112u);
  // A later micro-batch begins with the three norms gathered.
  const Zero3Phases later = zero3_module_phases(in, true);
  EXPECT_EQ(later.forward, (std::vector<uint64_t>{112, 62, 62}));
}

// stage3_max_reuse_distance past the whole trace: nothing is released before its last use.
TEST(Zero3Modules, ReuseKeepsEverythingUntilItsLastUse) {
  Zero3ModuleInput in = small(2);
  in.max_reuse = 1'000'000;
  const Zero3Phases p = zero3_module_phases(in, false);
  EXPECT_EQ(p.forward, (std::vector<uint64_t>{100, 184, 268}));
  EXPECT_EQ(p.head_forward, 372u);
  EXPECT_EQ(p.head_backward, 372u);                               // the head freed after its backward: the last use
  EXPECT_EQ(p.backward, (std::vector<uint64_t>{112, 192, 272}));  // the three norms and the table at the end
  EXPECT_EQ(p.kept, (std::vector<bool>{false, true, true}));
  // The same limit counts the elements between the uses: at 100 only what is used again within 100 elements stays.
  in.max_reuse = 100;
  const Zero3Phases near = zero3_module_phases(in, false);
  EXPECT_EQ(near.kept, (std::vector<bool>{false, false, false}));
  EXPECT_EQ(near.head_forward, 112u);
}

// A prefetch bucket of 40 elements: the entry that crosses it is fetched too (the head, 100), and a tensor a
// prefetch marked for a later use is not released (the block's b and c, and the head, stay to their backward).
TEST(Zero3Modules, PrefetchTakesTheCrossingEntryAndMarksLaterUses) {
  Zero3ModuleInput in = small(1);
  in.prefetch_bucket = 40;
  const Zero3Phases p = zero3_module_phases(in, false);
  // embed 100 + a, b, c prefetched (4 + 30 + 50 ≥ 40)
  EXPECT_EQ(p.forward[0], 184u);
  // b and c are prefetched in one coalesced all-gather: a flat buffer of 80 elements and no copies until b's fetch
  // waits on it, which copies both out (80); the buffer goes at c's fetch, the last of its tensors. The embedding
  // freed; a's use prefetches the final norm and the head (4 + 100, each on its own); b's the table again (100): at
  // b's fetch 8 + 100 + 100 + 80 + 80.
  EXPECT_EQ(p.forward[1], 368u);
  EXPECT_EQ(p.kept[1], true);
  EXPECT_EQ(p.head_forward, 288u);
  EXPECT_EQ(p.head_backward, 288u);
  EXPECT_EQ(p.backward[1], 188u);
  EXPECT_EQ(p.backward[0], 108u);
  EXPECT_EQ(p.after, 8u);
}

// Activation checkpointing: a block's backward recomputes its forward first, each tensor fetched for it again. With
// a reuse distance of 101 elements, b's recomputation (30) is used again after c twice (100): it stays, and so does
// c (used again at once): 8 + 30 + 50. Without checkpointing the backward fetches c, frees it, then b: 8 + 50.
TEST(Zero3Modules, CheckpointingFetchesTheBlockAgainInBackward) {
  Zero3ModuleInput in = small(1);
  in.max_reuse = 101;
  EXPECT_EQ(zero3_module_phases(in, false).backward[1], 58u);
  in.checkpoint = true;
  EXPECT_EQ(zero3_module_phases(in, false).backward[1], 88u);
}

// A tied head is the token table: it is fetched again for the head, not a tensor of its own.
TEST(Zero3Modules, TiedHeadUsesTheTable) {
  Zero3ModuleInput in;
  in.tensors = {{100, 4}, {4, 30, 50}};
  in.embedding = {true, false};
  in.tied = true;
  in.persistence = 4;
  in.max_live = 1'000'000;
  const Zero3Phases p = zero3_module_phases(in, false);
  EXPECT_EQ(p.forward[0], 100u);
  EXPECT_EQ(p.head_forward, 8u + 100);
  EXPECT_EQ(p.backward[0], 108u);
}

}  // namespace
}  // namespace emu::strategy

namespace emu::strategy {
namespace {

// The knobs as a shrunk run compares them: ÷ k² (k = 10: 100,000 → 1,000), a prefetch bucket of 0 kept at 0
// (DeepSpeed's prefetch off) where scaled() would make it 1; the tables' tensors, a Llama block's in forward order.
TEST(Zero3Modules, KnobsShrinkByKSquaredAndZeroStaysOff) {
  StrategyOptions options;
  options.shrink = 10;
  options.zero.param_persistence_threshold = 100'000;
  options.zero.prefetch_bucket_elements = 0;
  options.zero.max_reuse_distance = 2'000'000;
  options.zero.max_live_parameters = 30'000'000;
  AnalyticInput input;
  input.unit_counts = {30, 6};
  input.unit_tensors_charged = {{10, 10, 10}, {1, 2, 3}};
  input.forward_order = {{0, 1, 2}, {2, 0, 1}};
  const Zero3ModuleInput modules = zero3_module_input(options, input);
  EXPECT_EQ(modules.persistence, 1'000u);
  EXPECT_EQ(modules.prefetch_bucket, 0u);
  EXPECT_EQ(modules.max_reuse, 20'000u);
  EXPECT_EQ(modules.max_live, 300'000u);
  EXPECT_EQ(modules.tensors[0], (std::vector<uint64_t>{10, 10, 10}));  // the root in layout order
  EXPECT_EQ(modules.tensors[1], (std::vector<uint64_t>{3, 1, 2}));
}

}  // namespace
}  // namespace emu::strategy
