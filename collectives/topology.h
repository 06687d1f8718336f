// Who talks to whom: rings, binomial trees and block partitions, as pure functions of rank and group size.
//
// Ring, N = 4: every rank sends to the next and receives from the previous.
//
//     r0 ──▶ r1 ──▶ r2 ──▶ r3
//      ▲                    │
//      └────────────────────┘
//
// Binomial tree, N = 8, relative ranks v = (rank - root) mod N. A rank's parent is v with its lowest set bit
// cleared; its children are v + 2^k for every 2^k below that bit. A broadcast sends to the largest subtree first,
// so the tree is done after ceil(log2 N) rounds; a reduce walks it in the opposite order.
//
//     v0 ─┬─▶ v4 ─┬─▶ v6 ──▶ v7
//         │       └─▶ v5
//         ├─▶ v2 ──▶ v3
//         └─▶ v1
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "collectives/types.h"

namespace emu::coll {

constexpr int wrap(int index, int n) { return ((index % n) + n) % n; }
constexpr int ring_next(int rank, int n) { return wrap(rank + 1, n); }
constexpr int ring_prev(int rank, int n) { return wrap(rank - 1, n); }

// Ring reduce-scatter, steps s = 0 .. N-2: rank r sends its partial sum of block r-s-1 to the next rank and adds
// the previous rank's partial sum of block r-s-2 to its own, so after N-1 steps it holds block r complete.
constexpr int ring_rs_send_block(int rank, int step, int n) { return wrap(rank - step - 1, n); }
constexpr int ring_rs_recv_block(int rank, int step, int n) { return wrap(rank - step - 2, n); }
// Ring all-gather, steps s = 0 .. N-2: rank r forwards block r-s (its own first) and receives block r-s-1.
constexpr int ring_ag_send_block(int rank, int step, int n) { return wrap(rank - step, n); }
constexpr int ring_ag_recv_block(int rank, int step, int n) { return wrap(rank - step - 1, n); }

// Binomial tree on relative ranks (v = 0 is the root).
constexpr int binomial_parent(int v) { return v == 0 ? -1 : (v & (v - 1)); }
// Children in broadcast order: largest subtree first.
std::vector<int> binomial_children(int v, int n);

// NCCL's double binary tree (its src/graph/trees.cc, ncclGetBtree and ncclGetDtree; Sanders, Speck and Träff,
// "Two-tree algorithms for full bandwidth broadcast, reduction and scan", 2009). Tree 0 is an in-order binary tree
// rooted at rank 0: a rank r > 0 whose lowest set bit is b has children r - b/2 and r + b/2 (the right one
// brought back in range by halving b/2 while it is past N), and parent (r - b) + 2b, or r - b when that is past
// N; rank 0 has a single child, the largest power of two below N. Tree 1 is tree 0 mirrored (rank r plays N-1-r)
// when N is even, shifted by one (rank r plays r-1) when N is odd, so that the inner ranks of one tree are leaves
// of the other and every rank sends and receives about as much as every other. N = 8:
//
//     tree 0:  0 ──▶ 4 ─┬─▶ 2 ─┬─▶ 1        tree 1:  7 ──▶ 3 ─┬─▶ 5 ─┬─▶ 6
//                       │      └─▶ 3                          │      └─▶ 4
//                       └─▶ 6 ─┬─▶ 5                          └─▶ 1 ─┬─▶ 2
//                              └─▶ 7                                 └─▶ 0
struct TreeLinks {
  int parent = -1;  // -1: the root
  int child0 = -1;  // -1: none
  int child1 = -1;
};
TreeLinks dbtree_links(int tree, int rank, int n);
int dbtree_root(int tree, int n);

// A buffer cut into one block per rank: block r is elements [offset[r], offset[r] + count[r]).
struct Blocks {
  std::vector<size_t> offset;
  std::vector<size_t> count;
  size_t total = 0;
  size_t largest = 0;

  // `total` elements in n blocks as equal as can be: the first total % n blocks have one element more.
  static Blocks even(size_t total, int n);
  // n blocks of `count` elements each.
  static Blocks uniform(size_t count, int n);
  // Given sizes, in rank order.
  static Blocks of(std::span<const size_t> counts);
  // A call's blocks over n ranks (blocks_of below), every one of them: for the links that pass them to MPI or NCCL.
  static Blocks of(const Call& call, int n);
};

// The blocks of a buffer as Blocks cuts it, without building all n of them: block r's count and offset in O(1)
// when the cut is even or uniform, which is what lets a plan of 2^20 ranks account each collective over its virtual
// group without a pass over every rank. Given counts are read in place (`counts` must outlive the view).
class BlockView {
 public:
  static BlockView even(size_t total, int n);
  static BlockView uniform(size_t count, int n) { return even(count * static_cast<size_t>(n), n); }
  static BlockView of(std::span<const size_t> counts);
  static BlockView of(const ShardWindow& window, int n);
  size_t count(int r) const;
  size_t offset(int r) const;
  size_t total() const { return total_; }
  size_t largest() const { return largest_; }

 private:
  std::span<const size_t> counts_;  // empty: an even cut of total_ into n_ blocks, or window_'s
  ShardWindow window_;
  int n_ = 1;
  size_t total_ = 0;
  size_t largest_ = 0;
};

// A call's blocks over a group of n: even (`count` each), `counts` or `window` (reduce_scatter, all_gather).
BlockView blocks_of(const Call& call, int n);

// The largest power of two not above n (n >= 1).
constexpr int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// ceil(log2 n): the rounds of a binomial tree over n ranks (n >= 1).
constexpr int ceil_log2(int n) {
  int rounds = 0;
  while ((1 << rounds) < n) ++rounds;
  return rounds;
}

}  // namespace emu::coll
