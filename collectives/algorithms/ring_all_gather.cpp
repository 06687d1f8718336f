// Ring all-gather: rank r puts its block in place, then for N-1 steps forwards the block it received last (its
// own first) to the next rank. Works in the output buffer, no staging; blocks may differ in size.
#include <fmt/format.h>

#include "collectives/algorithm.h"
#include "collectives/steps.h"
#include "collectives/topology.h"

namespace emu::coll {
namespace {

void run(AlgorithmContext& context, const Call& call) {
  const int n = context.size();
  const int r = context.rank();
  const DType dtype = call.dtype;
  const Blocks blocks = Blocks::of(call, n);
  const auto mine = static_cast<size_t>(r);
  copy(dtype, call.send, at(call.recv, blocks.offset[mine], dtype), blocks.count[mine]);
  for (int step = 0; step < n - 1; ++step) {
    const auto a = static_cast<size_t>(ring_ag_send_block(r, step, n));
    const auto b = static_cast<size_t>(ring_ag_recv_block(r, step, n));
    const Transfer transfer{
        at(call.recv, blocks.offset[a], dtype), blocks.count[a], ring_next(r, n), static_cast<int>(a),
        at(call.recv, blocks.offset[b], dtype), blocks.count[b], ring_prev(r, n), static_cast<int>(b)};
    exchange_copy(context, dtype, fmt::format("all-gather step {}/{}", step + 1, n - 1), transfer);
  }
}

// Sends every block but r+1's, receives every block but its own.
Expectation expect(const Call& call, int r, int n, size_t, int) {
  const BlockView blocks = blocks_of(call, n);
  if (n == 1) return {};
  const uint64_t e = dtype_size(call.dtype);
  const auto block = [&](int i) { return blocks.count(wrap(i, n)) * e; };
  Expectation expectation;
  expectation.traffic.sent = blocks.total() * e - block(r + 1);
  expectation.traffic.received = blocks.total() * e - block(r);
  return expectation;
}

Cost cost(double s, int n, int /*ranks_per_node*/) {
  const double m = n - 1;
  return {m, m / n * s, 0, "(N-1) α + (N-1)/N S β"};
}

}  // namespace

extern const Algorithm kRingAllGather{CollectiveKind::kAllGather,
                                      "ring",
                                      "blocks passed around a ring; (N-1)/N of the output per rank",
                                      run,
                                      expect,
                                      cost};

}  // namespace emu::coll
