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

}  // namespace emu::coll
