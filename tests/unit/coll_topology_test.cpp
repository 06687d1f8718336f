// The collectives' pure parts, no MPI: ring and tree arithmetic, block partitions, the argument checks of the
// dispatch point, algorithm selection by name, the bf16 reduction kernel and the ledger's bookkeeping.
#include <gtest/gtest.h>

#include <map>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "collectives/communicator.h"
#include "collectives/reduce.h"
#include "collectives/topology.h"
#include "emu/bf16.h"
#include "emu/check.h"

namespace emu::coll {
namespace {

TEST(Ring, ReduceScatterEndsWithOwnBlockAndSendsEveryOtherOnce) {
  for (int n = 2; n <= 8; ++n) {
    for (int r = 0; r < n; ++r) {
      std::set<int> sent;
      for (int s = 0; s < n - 1; ++s) {
        sent.insert(ring_rs_send_block(r, s, n));
        // What r receives at step s is what its predecessor sends at step s.
        EXPECT_EQ(ring_rs_recv_block(r, s, n), ring_rs_send_block(ring_prev(r, n), s, n));
        EXPECT_EQ(ring_ag_recv_block(r, s, n), ring_ag_send_block(ring_prev(r, n), s, n));
      }
      EXPECT_EQ(sent.size(), static_cast<size_t>(n - 1));
      EXPECT_FALSE(sent.count(r)) << "its own block is never sent during reduce-scatter";
      EXPECT_EQ(ring_rs_recv_block(r, n - 2, n), r) << "the last block received completes its own";
      EXPECT_EQ(ring_ag_send_block(r, 0, n), r) << "all-gather starts with its own block";
    }
  }
}

TEST(BinomialTree, EveryRankHasOneParentAndDepthIsLogN) {
  for (int n = 1; n <= 17; ++n) {
    std::vector<int> parents(static_cast<size_t>(n), -2);
    for (int v = 0; v < n; ++v) {
      for (int child : binomial_children(v, n)) {
        ASSERT_LT(child, n);
        EXPECT_EQ(parents[static_cast<size_t>(child)], -2) << "child " << child << " of " << n;
        parents[static_cast<size_t>(child)] = v;
        EXPECT_EQ(binomial_parent(child), v);
      }
    }
    for (int v = 1; v < n; ++v) EXPECT_NE(parents[static_cast<size_t>(v)], -2) << v << " unreached of " << n;
    EXPECT_EQ(binomial_parent(0), -1);
  }
  EXPECT_EQ(binomial_children(0, 8), (std::vector<int>{4, 2, 1}));
  EXPECT_EQ(binomial_children(4, 8), (std::vector<int>{6, 5}));
  EXPECT_EQ(binomial_children(0, 5), (std::vector<int>{4, 2, 1}));
}

// NCCL's double binary tree, against the drawings in NCCL's src/graph/trees.cc (ncclGetBtree, ncclGetDtree): tree 0
// on 14 ranks, its mirror on 12 (N even) and its shift by one on 13 (N odd).
std::map<int, std::vector<int>> children_of(int tree, int n) {
  std::map<int, std::vector<int>> children;
  for (int r = 0; r < n; ++r) {
    const TreeLinks links = dbtree_links(tree, r, n);
    for (int child : {links.child0, links.child1}) {
      if (child >= 0) children[r].push_back(child);
    }
    std::sort(children[r].begin(), children[r].end());
    if (children[r].empty()) children.erase(r);
  }
  return children;
}

TEST(DoubleBinaryTree, NcclsDrawings) {
  using Children = std::map<int, std::vector<int>>;
  EXPECT_EQ(children_of(0, 14),
            (Children{{0, {8}}, {8, {4, 12}}, {4, {2, 6}}, {12, {10, 13}}, {2, {1, 3}}, {6, {5, 7}}, {10, {9, 11}}}));
  EXPECT_EQ(children_of(1, 12),
            (Children{{11, {3}}, {3, {1, 7}}, {1, {0, 2}}, {7, {5, 9}}, {5, {4, 6}}, {9, {8, 10}}}));
  EXPECT_EQ(children_of(1, 13),
            (Children{{1, {9}}, {9, {0, 5}}, {5, {3, 7}}, {0, {11}}, {3, {2, 4}}, {7, {6, 8}}, {11, {10, 12}}}));
  EXPECT_EQ(dbtree_root(0, 12), 0);
  EXPECT_EQ(dbtree_root(1, 12), 11);
  EXPECT_EQ(dbtree_root(1, 13), 1);
}

TEST(DoubleBinaryTree, TwoSpanningTreesWhoseInnerRanksAreLeavesOfTheOther) {
  for (int n = 1; n <= 33; ++n) {
    for (int tree = 0; tree < 2; ++tree) {
      int roots = 0;
      for (int r = 0; r < n; ++r) {
        const TreeLinks links = dbtree_links(tree, r, n);
        if (links.parent < 0) {
          ++roots;
          EXPECT_EQ(r, dbtree_root(tree, n));
          continue;
        }
        // The parent names r as a child, and walking up reaches the root.
        const TreeLinks up = dbtree_links(tree, links.parent, n);
        EXPECT_TRUE(up.child0 == r || up.child1 == r) << "tree " << tree << " n " << n << " r " << r;
        int hops = 0;
        for (int v = r; v != dbtree_root(tree, n) && hops <= n; v = dbtree_links(tree, v, n).parent) ++hops;
        EXPECT_LE(hops, n) << "tree " << tree << " n " << n << " r " << r << " never reaches the root";
      }
      EXPECT_EQ(roots, 1);
    }
    // No rank adds partial sums from two children in both trees (the second tree's point); rank 0 of an odd N,
    // tree 0's root with its single child, is the one rank inner in both.
    for (int r = 0; r < n; ++r) {
      const bool two0 = dbtree_links(0, r, n).child1 >= 0;
      const bool two1 = dbtree_links(1, r, n).child1 >= 0;
      EXPECT_FALSE(two0 && two1) << "n " << n << " r " << r;
    }
  }
}

TEST(Blocks, EvenSplitPutsTheRemainderFirst) {
  const Blocks blocks = Blocks::even(10, 4);
  EXPECT_EQ(blocks.count, (std::vector<size_t>{3, 3, 2, 2}));
  EXPECT_EQ(blocks.offset, (std::vector<size_t>{0, 3, 6, 8}));
  EXPECT_EQ(blocks.largest, 3u);
  EXPECT_EQ(Blocks::even(2, 4).count, (std::vector<size_t>{1, 1, 0, 0}));
  const std::vector<size_t> counts{0, 5, 2};
  const Blocks uneven = Blocks::of(counts);
  EXPECT_EQ(uneven.offset, (std::vector<size_t>{0, 0, 5}));
  EXPECT_EQ(uneven.total, 7u);
  EXPECT_EQ(uneven.largest, 5u);
}

// The view cuts as Blocks does, block by block, without holding the n blocks (the same hand-counted cases), and at
// 2^20 ranks, where a plan's collectives are accounted: 10^9 = 953 · 2^20 + 707,072 elements, so 707,072 blocks of
// 954 first, then blocks of 953.
TEST(BlockView, CutsAsBlocksDoesWithoutHoldingThem) {
  const BlockView view = BlockView::even(10, 4);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(view.count(r), (std::vector<size_t>{3, 3, 2, 2})[static_cast<size_t>(r)]) << r;
    EXPECT_EQ(view.offset(r), (std::vector<size_t>{0, 3, 6, 8})[static_cast<size_t>(r)]) << r;
  }
  EXPECT_EQ(view.largest(), 3u);
  EXPECT_EQ(view.total(), 10u);
  EXPECT_EQ(BlockView::even(2, 4).count(1), 1u);
  EXPECT_EQ(BlockView::even(2, 4).count(2), 0u);
  EXPECT_EQ(BlockView::even(2, 4).offset(3), 2u);
  EXPECT_EQ(BlockView::uniform(5, 3).offset(2), 10u);
  const std::vector<size_t> counts{0, 5, 2};
  const BlockView uneven = BlockView::of(counts);
  EXPECT_EQ(uneven.offset(2), 5u);
  EXPECT_EQ(uneven.count(1), 5u);
  EXPECT_EQ(uneven.total(), 7u);
  EXPECT_EQ(uneven.largest(), 5u);
  const int n = 1 << 20;
  const BlockView big = BlockView::even(1'000'000'000, n);
  EXPECT_EQ(big.count(0), 954u);
  EXPECT_EQ(big.count(707'071), 954u);
  EXPECT_EQ(big.count(707'072), 953u);
  EXPECT_EQ(big.offset(707'072), 707'072u * 954u);
  EXPECT_EQ(big.offset(n - 1) + big.count(n - 1), 1'000'000'000u);
  EXPECT_EQ(big.largest(), 954u);
}

// A window over equal shards (ZeRO's bucket ranges of its flat partitions) cuts the range as the explicit per-rank
// counts do: here each rank's block written out by hand, then every window over 4 shards of 5 checked against the
// clip of [5r, 5r + 5) to [lo, hi) computed in the test; at 2^20 ranks in O(1).
TEST(BlockView, WindowOverEqualShardsCutsAsItsCounts) {
  const BlockView view = BlockView::of(ShardWindow{5, 3, 17}, 4);  // [3, 5) [5, 10) [10, 15) [15, 17)
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(view.count(r), (std::vector<size_t>{2, 5, 5, 2})[static_cast<size_t>(r)]) << r;
    EXPECT_EQ(view.offset(r), (std::vector<size_t>{0, 2, 7, 12})[static_cast<size_t>(r)]) << r;
  }
  EXPECT_EQ(view.total(), 14u);
  EXPECT_EQ(view.largest(), 5u);
  for (size_t lo = 0; lo <= 20; ++lo) {
    for (size_t hi = lo; hi <= 20; ++hi) {
      std::vector<size_t> counts;
      for (size_t r = 0; r < 4; ++r) {
        const size_t begin = std::max(lo, 5 * r), end = std::min(hi, 5 * r + 5);
        counts.push_back(end > begin ? end - begin : 0);
      }
      const BlockView window = BlockView::of(ShardWindow{5, lo, hi}, 4);
      const BlockView given = BlockView::of(counts);
      for (int r = 0; r < 4; ++r) {
        ASSERT_EQ(window.count(r), given.count(r)) << lo << " " << hi << " rank " << r;
        ASSERT_EQ(window.offset(r), given.offset(r)) << lo << " " << hi << " rank " << r;
      }
      ASSERT_EQ(window.total(), given.total()) << lo << " " << hi;
      ASSERT_EQ(window.largest(), given.largest()) << lo << " " << hi;
    }
  }
  const int n = 1 << 20;
  const BlockView big = BlockView::of(ShardWindow{6'676, 500'000'000, 1'000'000'000}, n);
  // Rank 74,895's shard is [499,999,020, 500,005,696): 5,696 elements of it lie in the window; rank 74,894's none.
  EXPECT_EQ(big.count(74'894), 0u);
  EXPECT_EQ(big.count(74'895), 5'696u);
  EXPECT_EQ(big.offset(74'896), 5'696u);
  EXPECT_EQ(big.count(74'896), 6'676u);
  EXPECT_EQ(big.total(), 500'000'000u);
  EXPECT_EQ(big.largest(), 6'676u);
  EXPECT_EQ(big.offset(n - 1), 500'000'000u);
}

TEST(CheckCall, NamesTheProblem) {
  std::vector<float> a(8);
  std::vector<float> b(8);
  Call call{CollectiveKind::kAllReduce, a.data(), b.data(), 8, {}, DType::kF32, ReduceOp::kSum, 0, {}};
  EXPECT_EQ(check_call(call, 0, 4), "");
  call.send = nullptr;
  EXPECT_NE(check_call(call, 0, 4).find("send buffer is null"), std::string::npos);
  call.send = a.data() + 1;
  call.recv = a.data();
  call.count = 4;
  EXPECT_NE(check_call(call, 0, 4).find("overlap"), std::string::npos);
  Call broadcast{CollectiveKind::kBroadcast, a.data(), a.data(), 8, {}, DType::kF32, ReduceOp::kSum, 4, {}};
  EXPECT_NE(check_call(broadcast, 0, 4).find("root 4"), std::string::npos);
  Call send{CollectiveKind::kSend, a.data(), nullptr, 8, {}, DType::kF32, ReduceOp::kSum, 2, {}};
  EXPECT_NE(check_call(send, 2, 4).find("peer 2"), std::string::npos);
  // In-place reduce-scatter: the rank's block inside the input is fine; anywhere else inside it is not.
  Call reduce_scatter{
      CollectiveKind::kReduceScatter, a.data(), a.data() + 4, 2, {}, DType::kF32, ReduceOp::kSum, 0, {}};
  EXPECT_EQ(check_call(reduce_scatter, 2, 4), "");
  EXPECT_NE(check_call(reduce_scatter, 1, 4), "");
  const std::vector<size_t> counts{1, 2};
  reduce_scatter.counts = counts;
  EXPECT_NE(check_call(reduce_scatter, 0, 4).find("2 per-rank counts"), std::string::npos);
}

// A one-rank link: enough to build a Communicator without MPI.
class SoloLink final : public Link {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view library() const override { return "solo"; }
  void exchange(const void*, size_t, int, void*, size_t, int) override { FAIL() << "a single rank never exchanges"; }
  void native(const Call& call) override {
    if (call.kind == CollectiveKind::kAllReduce) copy_through(call);
  }
  void gather_all(const void* mine, size_t bytes, void* all) override { std::memcpy(all, mine, bytes); }
  std::unique_ptr<Link> split(int, int) override { return std::make_unique<SoloLink>(); }

 private:
  static void copy_through(const Call& call) {
    if (call.send != call.recv) std::memcpy(call.recv, call.send, call.count * dtype_size(call.dtype));
  }
};

TEST(Selection, RingIsTheDefaultAndUnknownNamesListTheValidOnes) {
  auto device = make_cpu_device({});
  Communicator comm(std::make_unique<SoloLink>(), *device, "solo");
  EXPECT_EQ(comm.algorithm(CollectiveKind::kAllReduce).name, "ring");
  EXPECT_EQ(comm.algorithm(CollectiveKind::kReduceScatter).name, "ring");
  EXPECT_EQ(comm.algorithm(CollectiveKind::kAllGather).name, "ring");
  EXPECT_EQ(comm.algorithm(CollectiveKind::kBroadcast).name, "tree");
  try {
    comm.set_algorithm(CollectiveKind::kAllReduce, "butterfly");
    FAIL() << "expected an InputError";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("ring, rhd, tree, dbtree, hier, mpi"), std::string::npos) << error.what();
  }
  comm.set_algorithms("all_reduce=rhd,broadcast=mpi");
  EXPECT_EQ(comm.algorithm(CollectiveKind::kAllReduce).name, "rhd");
  EXPECT_EQ(comm.algorithm(CollectiveKind::kBroadcast).name, "mpi");
  EXPECT_THROW(comm.set_algorithms("allreduce=ring"), InputError);
  EXPECT_THROW(comm.set_algorithms("reduce=rhd"), InputError);
}

TEST(Selection, EveryKindButPointToPointHasOurAlgorithmAndMpi) {
  for (size_t i = 0; i < kNumKinds; ++i) {
    const CollectiveKind kind = kind_at(i);
    const auto found = algorithms_for(kind);
    if (!is_collective(kind)) {
      EXPECT_TRUE(found.empty());
      continue;
    }
    ASSERT_GE(found.size(), 2u) << kind_name(kind);
    EXPECT_NE(found.front()->name, "mpi") << "the default is ours";
    EXPECT_NE(find_algorithm(kind, "mpi"), nullptr);
  }
}

TEST(Reduce, Bf16RoundsEveryStepToNearestEven) {
  // 256 + 1 is not a bf16: it rounds to 256 (ties to even), so three steps of +1 from 256 stay at 256.
  uint16_t acc = float_to_bf16(256.0f);
  const uint16_t one = float_to_bf16(1.0f);
  for (int i = 0; i < 3; ++i) reduce(DType::kBF16, ReduceOp::kSum, &acc, &one, &acc, 1);
  EXPECT_EQ(bf16_to_float(acc), 256.0f);
  float x[3] = {1, 5, -2};
  const float y[3] = {4, 2, -3};
  reduce(DType::kF32, ReduceOp::kMax, x, y, x, 3);
  EXPECT_EQ(x[0], 4.0f);
  EXPECT_EQ(x[1], 5.0f);
  EXPECT_EQ(x[2], -2.0f);
}

TEST(LedgerBook, ChargesByKindAndPhase) {
  Ledger ledger("world");
  ledger.charge(CollectiveKind::kAllGather, "forward, unit 1", {10, 20}, {10, 20}, 0.5);
  ledger.charge(CollectiveKind::kAllGather, "forward, unit 1", {1, 2}, {1, 2}, 0.25);
  ledger.charge(CollectiveKind::kReduceScatter, "backward, unit 1", {5, 5}, {5, 5}, 1);
  EXPECT_EQ(ledger.at(CollectiveKind::kAllGather, "forward, unit 1").calls, 2u);
  EXPECT_EQ(ledger.at(CollectiveKind::kAllGather, "forward, unit 1").moved, (Traffic{11, 22}));
  EXPECT_EQ(ledger.at(CollectiveKind::kAllGather, "backward, unit 1").calls, 0u);
  EXPECT_DOUBLE_EQ(ledger.total().seconds, 1.75);
  EXPECT_NE(ledger.format().find("forward, unit 1"), std::string::npos);
}

}  // namespace
}  // namespace emu::coll
