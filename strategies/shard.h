// Shard arithmetic: which elements of a flat buffer each rank owns.
//
// A flat buffer of `numel` elements is padded to a multiple of the number of ranks N (times an alignment) and cut
// into N equal shards, as FSDP pads its flat parameters (to N) and DeepSpeed its ZeRO-1/2 flat groups (to 2N:
// stage_1_and_2.py's nccl_start_alignment_factor, 4-byte-aligned bf16 partitions). The padding lives at the end of the
// last shard(s): a rank may own fewer real elements than its shard holds, or none.
//
//   numel = 10, N = 4:  padded 12, shard 3
//   rank 0 [0, 3)  rank 1 [3, 6)  rank 2 [6, 9)  rank 3 [9, 10) + 2 padding
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace emu::strategy {

struct ShardInfo {
  size_t numel = 0;   // real elements of the whole buffer
  size_t padded = 0;  // numel rounded up to a multiple of ranks
  size_t shard = 0;   // elements per shard, padding included: padded / ranks
  size_t offset = 0;  // where this rank's shard starts in the padded buffer
  size_t valid = 0;   // real elements in this rank's shard: shard minus its padding
  int rank = 0;
  int ranks = 1;

  size_t padding() const { return padded - numel; }
  size_t end() const { return offset + valid; }  // one past this rank's last real element
  // The real elements of [begin, end) that fall in this rank's shard, as [lo, hi) in buffer coordinates;
  // lo == hi when they do not meet.
  void intersect(size_t begin, size_t end_, size_t& lo, size_t& hi) const {
    lo = std::max(begin, offset);
    hi = std::min(end_, end());
    if (hi < lo) hi = lo;
  }
};

// `alignment`: the padded size is a multiple of ranks × alignment.
inline ShardInfo shard_of(size_t numel, int rank, int ranks, size_t alignment = 1) {
  ShardInfo info;
  info.numel = numel;
  info.rank = rank;
  info.ranks = ranks;
  const size_t n = static_cast<size_t>(ranks);
  const size_t multiple = n * alignment;
  info.padded = (numel + multiple - 1) / multiple * multiple;
  info.shard = info.padded / n;
  info.offset = info.shard * static_cast<size_t>(rank);
  info.valid = info.offset >= numel ? 0 : std::min(info.shard, numel - info.offset);
  return info;
}

// Every rank's real elements of a buffer of `numel` over `ranks` (shard_of(...).valid): the blocks of an uneven
// reduce-scatter or all-gather over the shards.
inline std::vector<size_t> shard_counts(size_t numel, int ranks) {
  std::vector<size_t> counts;
  counts.reserve(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) counts.push_back(shard_of(numel, r, ranks).valid);
  return counts;
}

}  // namespace emu::strategy
