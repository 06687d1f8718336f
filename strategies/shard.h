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
#include <span>
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

// DeepSpeed pads its ZeRO-1/2 flat bit16 group to a multiple of this many × N elements
// (nccl_start_alignment_factor).
inline constexpr size_t kNcclStartAlignment = 2;

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

// DeepSpeed's ZeRO-1/2 gradient partition (stage_1_and_2.py copy_grads_in_partition: grads_in_partition) is sized
// for the whole of every tensor that meets the rank's partition of the flat group (get_partition_info's
// params_in_partition: the tensors starting in it and the one straddling its start), not for its S elements: a tensor
// across a boundary counts whole on both sides, a partition inside one tensor holds that tensor's size, a partition
// of padding alone none. The tensors in the group's order (DeepSpeed's: registration order):
//
//   tensors 5, 4, 3 at [0, 5) [5, 9) [9, 12), N = 4, S = 3:
//   rank 0 [0, 3): 5   rank 1 [3, 6): 5 + 4   rank 2 [6, 9): 4   rank 3 [9, 12): 3
//
// `tensors` are the elements each tensor is charged for (model::tensor_charge: as held at full scale; in a shrunk run
// a norm weight or bias ÷ k), which lays them out as the full-scale tensors lie ÷ k²: a shrunk rank's partition
// meets the tensors the full-scale rank's meets, where the shrunk layout's own boundaries (norms ∝ h, V and F
// rounded) could fall in a neighbouring tensor and charge it whole.

// S of the group of `tensors` over `ranks`, padded to a multiple of ranks × alignment (shard_of).
inline uint64_t group_shard(std::span<const uint64_t> tensors, int ranks, size_t alignment) {
  uint64_t total = 0;
  for (const uint64_t tensor : tensors) total += tensor;
  return shard_of(total, 0, ranks, alignment).shard;
}

// What partition `partition` (elements [partition·S, (partition + 1)·S)) sizes its gradient partition for.
inline uint64_t whole_tensors_meeting(std::span<const uint64_t> tensors, uint64_t shard, uint64_t partition) {
  const uint64_t lo = shard * partition;
  const uint64_t hi = lo + shard;
  uint64_t at = 0;
  uint64_t whole = 0;
  for (const uint64_t tensor : tensors) {
    if (tensor > 0 && at < hi && at + tensor > lo) whole += tensor;
    at += tensor;
  }
  return whole;
}

// Of partitions first..last, the lowest one whose whole_tensors_meeting is the most. One pass over the tensors and
// the partitions (a plan's 2^20 ranks), never one pass over the tensors per partition.
inline uint64_t partition_with_most_whole_tensors(std::span<const uint64_t> tensors, uint64_t shard, uint64_t first,
                                                  uint64_t last) {
  // Each tensor adds its size to the partitions it meets, a range: a difference array over first..last (the
  // unsigned sums wrap and come back, as each range's add is undone at its end).
  std::vector<uint64_t> change(last - first + 2, 0);
  uint64_t at = 0;
  for (const uint64_t tensor : tensors) {
    if (tensor > 0) {
      const uint64_t begin = std::max(at / shard, first);
      const uint64_t end = std::min((at + tensor - 1) / shard, last);
      if (begin <= end) {
        change[begin - first] += tensor;
        change[end - first + 1] -= tensor;
      }
    }
    at += tensor;
  }
  uint64_t best = first;
  uint64_t most = 0;
  uint64_t running = 0;
  for (uint64_t p = first; p <= last; ++p) {
    running += change[p - first];
    if (running > most) {
      most = running;
      best = p;
    }
  }
  return best;
}

// DeepSpeed ZeRO-3's optimizer sub-groups (stage3.py _create_fp16_sub_groups): the tensors in registration order,
// each partitioned on its own (⌈t/N⌉ elements a rank, its ds_tensor), a sub-group closed once it holds `limit`
// (sub_group_size) partition elements or at the last tensor. step() flattens and casts one sub-group's gradients at
// a time. Each sub-group's partition elements.
//
//   tensors 8, 2, 6, 4, N = 2, limit 4:  partitions 4, 1, 3, 2  →  sub-groups [4] [1, 3] [2]: 4, 4, 2
//
// `tensors` and `limit` as a shrunk run charges them (whole_tensors_meeting; the knob ÷ k²), `shrink` the model's k.
// A tensor's padding to N, at most one element a rank at full scale, is a fixed count that a shrunk run charges
// ÷ k², where ⌈t/N⌉ of the shrunk tensor would charge it whole (2% over the plan on a 2-layer GPT-2 at k 8): the sums
// are kept in 1/k² elements, each tensor's ⌈t·k²/N⌉, and each sub-group charged rounded up.
inline std::vector<uint64_t> sub_group_partitions(std::span<const uint64_t> tensors, int ranks, uint64_t limit,
                                                  uint64_t shrink) {
  const auto n = static_cast<uint64_t>(ranks);
  const uint64_t k2 = shrink * shrink;
  std::vector<uint64_t> groups;
  uint64_t held = 0;  // in 1/k² elements
  for (size_t i = 0; i < tensors.size(); ++i) {
    held += (tensors[i] * k2 + n - 1) / n;
    if (held >= limit * k2 || i + 1 == tensors.size()) {
      groups.push_back((held + k2 - 1) / k2);
      held = 0;
    }
  }
  return groups;
}

}  // namespace emu::strategy
