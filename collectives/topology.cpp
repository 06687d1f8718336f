#include "collectives/topology.h"

#include <algorithm>

namespace emu::coll {

std::vector<int> binomial_children(int v, int n) {
  const int lowest = v == 0 ? floor_pow2(std::max(n - 1, 1)) * 2 : (v & -v);
  std::vector<int> children;
  for (int mask = lowest / 2; mask >= 1; mask /= 2) {
    if (v + mask < n) children.push_back(v + mask);
  }
  return children;
}

namespace {

// Tree 0 of the double binary tree (ncclGetBtree's shape).
TreeLinks in_order_tree(int rank, int n) {
  TreeLinks links;
  if (rank == 0) {
    if (n > 1) links.child0 = floor_pow2(n - 1);
    return links;
  }
  const int bit = rank & -rank;
  links.parent = (rank ^ bit) | (bit << 1);
  if (links.parent >= n) links.parent = rank ^ bit;
  int half = bit >> 1;
  if (half > 0) links.child0 = rank - half;
  while (half > 0 && rank + half >= n) half >>= 1;
  if (half > 0) links.child1 = rank + half;
  return links;
}

}  // namespace

TreeLinks dbtree_links(int tree, int rank, int n) {
  if (tree == 0) return in_order_tree(rank, n);
  // Tree 1: rank r plays position p(r) of tree 0; its links are the ranks playing the linked positions.
  const bool odd = n % 2 == 1;
  const auto position = [&](int r) { return odd ? wrap(r - 1, n) : n - 1 - r; };
  const auto rank_at = [&](int p) { return p < 0 ? -1 : (odd ? wrap(p + 1, n) : n - 1 - p); };
  const TreeLinks shape = in_order_tree(position(rank), n);
  return {rank_at(shape.parent), rank_at(shape.child0), rank_at(shape.child1)};
}

int dbtree_root(int tree, int n) { return tree == 0 || n == 1 ? 0 : (n % 2 == 1 ? 1 : n - 1); }

Blocks Blocks::even(size_t total, int n) {
  Blocks blocks;
  const size_t ranks = static_cast<size_t>(n);
  blocks.offset.resize(ranks);
  blocks.count.resize(ranks);
  size_t offset = 0;
  for (size_t r = 0; r < ranks; ++r) {
    blocks.offset[r] = offset;
    blocks.count[r] = total / ranks + (r < total % ranks ? 1 : 0);
    offset += blocks.count[r];
  }
  blocks.total = total;
  blocks.largest = ranks == 0 ? 0 : blocks.count[0];
  return blocks;
}

Blocks Blocks::uniform(size_t count, int n) { return even(count * static_cast<size_t>(n), n); }

Blocks Blocks::of(std::span<const size_t> counts) {
  Blocks blocks;
  size_t offset = 0;
  for (size_t c : counts) {
    blocks.offset.push_back(offset);
    blocks.count.push_back(c);
    offset += c;
    blocks.largest = std::max(blocks.largest, c);
  }
  blocks.total = offset;
  return blocks;
}

Blocks Blocks::of(const Call& call, int n) {
  if (!call.window.active()) return call.counts.empty() ? uniform(call.count, n) : of(call.counts);
  Blocks blocks;
  for (int r = 0; r < n; ++r) {
    blocks.offset.push_back(call.window.offset(r));
    blocks.count.push_back(call.window.count(r));
    blocks.largest = std::max(blocks.largest, blocks.count.back());
  }
  blocks.total = call.window.hi - call.window.lo;
  return blocks;
}

BlockView BlockView::even(size_t total, int n) {
  BlockView view;
  view.n_ = n;
  view.total_ = total;
  view.largest_ = n <= 0 ? 0 : total / static_cast<size_t>(n) + (total % static_cast<size_t>(n) != 0 ? 1 : 0);
  return view;
}

BlockView BlockView::of(std::span<const size_t> counts) {
  BlockView view;
  view.counts_ = counts;
  view.n_ = static_cast<int>(counts.size());
  for (const size_t c : counts) {
    view.total_ += c;
    view.largest_ = std::max(view.largest_, c);
  }
  return view;
}

// The window's blocks in O(1): the first and last ranks it meets hold its partial ends, any between a whole shard.
BlockView BlockView::of(const ShardWindow& window, int n) {
  BlockView view;
  view.window_ = window;
  view.n_ = n;
  view.total_ = window.hi - window.lo;
  if (view.total_ > 0) {
    const auto first = static_cast<int>(window.lo / window.shard);
    const auto last = static_cast<int>((window.hi - 1) / window.shard);
    view.largest_ = last - first >= 2 ? window.shard : std::max(window.count(first), window.count(last));
  }
  return view;
}

BlockView blocks_of(const Call& call, int n) {
  if (call.window.active()) return BlockView::of(call.window, n);
  return call.counts.empty() ? BlockView::uniform(call.count, n) : BlockView::of(call.counts);
}

// As Blocks::even: the first total % n blocks have one element more.
size_t BlockView::count(int r) const {
  const auto i = static_cast<size_t>(r);
  if (window_.active()) return window_.count(r);
  if (!counts_.empty()) return counts_[i];
  const auto n = static_cast<size_t>(n_);
  return total_ / n + (i < total_ % n ? 1 : 0);
}

size_t BlockView::offset(int r) const {
  const auto i = static_cast<size_t>(r);
  if (window_.active()) return window_.offset(r);
  if (!counts_.empty()) {
    size_t offset = 0;
    for (size_t j = 0; j < i; ++j) offset += counts_[j];
    return offset;
  }
  const auto n = static_cast<size_t>(n_);
  return i * (total_ / n) + std::min(i, total_ % n);
}

}  // namespace emu::coll
