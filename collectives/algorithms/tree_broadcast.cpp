// Binomial-tree broadcast: each rank receives the whole buffer from its parent, then sends it to its children,
// largest subtree first; done after ceil(log2 N) rounds. Latency-friendly; the root sends the buffer
// ceil(log2 N) times, so for large buffers a ring (pipelined chain) would use the links better.
#include <fmt/format.h>

#include "collectives/algorithm.h"
#include "collectives/steps.h"
#include "collectives/topology.h"

namespace emu::coll {
namespace {

void run(AlgorithmContext& context, const Call& call) {
  const int n = context.size();
  const int v = wrap(context.rank() - call.root, n);
  const auto real = [&](int relative) { return wrap(relative + call.root, n); };
  if (v == 0) copy(call.dtype, call.send, call.recv, call.count);
  if (n == 1 || call.count == 0) return;
  if (v != 0) {
    Transfer transfer;
    transfer.recv = call.recv;
    transfer.recv_count = call.count;
    transfer.from = real(binomial_parent(v));
    exchange_copy(context, call.dtype, "receive from parent", transfer);
  }
  for (int child : binomial_children(v, n)) {
    Transfer transfer;
    transfer.send = call.recv;
    transfer.send_count = call.count;
    transfer.to = real(child);
    exchange_copy(context, call.dtype, fmt::format("send to subtree of r{}", real(child)), transfer);
  }
}

Expectation expect(const Call& call, int rank, int n, size_t, int) {
  if (n == 1 || call.count == 0) return {};
  const int v = wrap(rank - call.root, n);
  const uint64_t bytes = call.count * dtype_size(call.dtype);
  Expectation expectation;
  expectation.traffic.sent = binomial_children(v, n).size() * bytes;
  expectation.traffic.received = v == 0 ? 0 : bytes;
  return expectation;
}

// The root sends the whole buffer once per round.
Cost cost(double s, int n, int /*ranks_per_node*/) {
  const double rounds = ceil_log2(n);
  return {rounds, rounds * s, 0, "ceil(log2 N) (α + S β)"};
}

}  // namespace

extern const Algorithm kTreeBroadcast{CollectiveKind::kBroadcast,
                                      "tree",
                                      "binomial tree from the root; ceil(log2 N) rounds of the whole buffer",
                                      run,
                                      expect,
                                      cost};

}  // namespace emu::coll
