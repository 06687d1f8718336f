// The vocabulary of the collectives layer: collective kinds, reduction operators, one call's arguments, and bytes
// moved. Backend-neutral: nothing here knows about MPI or NCCL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "emu/dtype.h"

namespace emu::coll {

enum class CollectiveKind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kBarrier,
  kSend,
  kRecv,
};
inline constexpr size_t kNumKinds = 9;
inline constexpr CollectiveKind kind_at(size_t index) { return static_cast<CollectiveKind>(index); }
// "all_reduce", "reduce_scatter", ... (the names used on command lines and in JSON)
std::string_view kind_name(CollectiveKind kind);
std::optional<CollectiveKind> parse_kind(std::string_view name);
// An algorithm list as given on the command line, "all_reduce=ring,all_gather=mpi": (kind, algorithm) in order,
// empty items skipped. Throws InputError for an item that is not <kind>=<algorithm> with a known kind.
std::vector<std::pair<CollectiveKind, std::string_view>> parse_algorithm_list(std::string_view list);
// Collectives are called by every rank of a group and numbered; send and recv are point-to-point.
inline constexpr bool is_collective(CollectiveKind kind) {
  return kind != CollectiveKind::kSend && kind != CollectiveKind::kRecv;
}

enum class ReduceOp : uint8_t { kSum, kAvg, kMax };
std::string_view op_name(ReduceOp op);
std::optional<ReduceOp> parse_op(std::string_view name);
std::optional<DType> parse_dtype(std::string_view name);

// One call's arguments, as the dispatch point checks them and the algorithms read them. Counts are elements.
//   all_reduce, broadcast, reduce   count = elements of the whole buffer (send and recv alike)
//   reduce_scatter                  count = elements each rank receives; send holds size * count
//                                   (NCCL semantics); with `counts` (or `window`), rank r receives counts[r] and
//                                   send holds their sum, blocks laid out in rank order
//   all_gather                      count = elements each rank contributes; recv holds size * count; with
//                                   `counts` (or `window`), rank r contributes counts[r]
//   all_to_all                      count = elements sent to each peer; send and recv hold size * count
//   send, recv                      count = elements of the message; `root` is the peer
// In place: all_reduce, broadcast, reduce: send == recv. reduce_scatter: recv == send + rank's block offset.
// all_gather: send == recv + rank's block offset. all_to_all: send == recv.
// Uneven blocks cut from equal shards, as ZeRO reduces and gathers its flat partitions one bucket's range at a
// time: rank r's block is its shard [r·shard, (r+1)·shard) cut to the range [lo, hi), counted from lo, so that the
// blocks tile the range in rank order (hi ≤ size · shard). Unlike per-rank counts, any rank's block follows in
// O(1): a plan over 2^20 virtual ranks builds no million-entry vector per bucket.
struct ShardWindow {
  size_t shard = 0;  // 0: no window
  size_t lo = 0, hi = 0;
  bool active() const { return shard > 0; }
  // Rank r's block: its count, and its offset from lo.
  size_t count(int r) const;
  size_t offset(int r) const;
};

struct Call {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  std::span<const size_t> counts;  // per-rank blocks for the uneven reduce_scatter / all_gather; else empty
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;  // broadcast / reduce root; send / recv peer
  std::string_view phase;
  ShardWindow window{};  // uneven reduce_scatter / all_gather blocks as a window over equal shards (`counts` empty)
};

// Whether the call's blocks are uneven: given per rank, or as a window.
inline bool uneven(const Call& call) { return !call.counts.empty() || call.window.active(); }

// Bytes this rank sent and received through point-to-point.
struct Traffic {
  uint64_t sent = 0;
  uint64_t received = 0;
  Traffic& operator+=(const Traffic& other) {
    sent += other.sent;
    received += other.received;
    return *this;
  }
  friend bool operator==(const Traffic&, const Traffic&) = default;
};

// The bytes of the whole payload, S in the bandwidth formulas: the all-reduce buffer, the reduce-scatter input,
// the all-gather output, the broadcast buffer, the all-to-all send buffer, the message.
uint64_t payload_bytes(const Call& call, int size);

// nccl-tests' bus bandwidth factor: busbw = algbw * factor, so that busbw compares with the link's peak whatever
// the algorithm. all_reduce 2(N-1)/N; reduce_scatter, all_gather, all_to_all (N-1)/N; the others 1.
double bus_factor(CollectiveKind kind, int size);

}  // namespace emu::coll
