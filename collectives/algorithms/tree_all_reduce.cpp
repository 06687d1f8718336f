// Tree all-reduce: a binomial-tree reduce into rank 0, then a binomial-tree broadcast of the sum from it — the
// two registered tree algorithms run one after the other. 2 ceil(log2 N) rounds of the whole buffer: fewer
// rounds than the ring's 2(N-1), so cheaper for small messages, where the latency α dominates; but rank 0 sends
// and receives the whole buffer in every round, so for large ones the ring, 2(N-1)/N of it per rank, wins.
// (NCCL's tree is a pipelined double binary tree, which keeps every link busy; this is the textbook one.)
#include <algorithm>

#include "collectives/algorithm.h"
#include "collectives/topology.h"

namespace emu::coll {

extern const Algorithm kTreeReduce, kTreeBroadcast;

namespace {

Call reduce_part(const Call& call) {
  Call reduce = call;
  reduce.kind = CollectiveKind::kReduce;
  reduce.root = 0;
  return reduce;
}

Call broadcast_part(const Call& call) {
  Call broadcast = call;
  broadcast.kind = CollectiveKind::kBroadcast;
  broadcast.root = 0;
  broadcast.send = call.recv;  // rank 0's sum; the other ranks' is overwritten
  return broadcast;
}

void run(AlgorithmContext& context, const Call& call) {
  kTreeReduce.run(context, reduce_part(call));
  kTreeBroadcast.run(context, broadcast_part(call));
}

// The reduce's buffers are freed before the broadcast, which has none.
Expectation expect(const Call& call, int rank, int n, size_t slice_bytes, int /*ranks_per_node*/) {
  const Expectation reduce = kTreeReduce.expect(reduce_part(call), rank, n, slice_bytes, 0);
  const Expectation broadcast = kTreeBroadcast.expect(broadcast_part(call), rank, n, slice_bytes, 0);
  Expectation expectation;
  expectation.traffic = reduce.traffic;
  expectation.traffic += broadcast.traffic;
  expectation.buffer_bytes = std::max(reduce.buffer_bytes, broadcast.buffer_bytes);
  return expectation;
}

// Rank 0 receives and adds the buffer once per round of the reduce, then sends it once per round of the
// broadcast.
Cost cost(double s, int n, int /*ranks_per_node*/) {
  const double rounds = ceil_log2(n);
  return {2 * rounds, 2 * rounds * s, rounds * s, "2 ceil(log2 N) (α + S β) + ceil(log2 N) S γ"};
}

constexpr std::string_view kSummary = "binomial reduce into rank 0, then binomial broadcast; 2 ceil(log2 N) rounds";

}  // namespace

extern const Algorithm kTreeAllReduce{CollectiveKind::kAllReduce, "tree", kSummary, run, expect, cost};

}  // namespace emu::coll
