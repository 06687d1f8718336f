// Ring all-reduce: the buffer is cut into N blocks; a ring reduce-scatter run in place leaves rank r holding
// block r fully reduced, then a ring all-gather passes the reduced blocks around. 2(N-1) steps; each rank sends
// and receives every block but one in each half, 2(N-1)/N of the buffer when N divides it.
#include <fmt/format.h>

#include <algorithm>

#include "collectives/algorithm.h"
#include "collectives/steps.h"
#include "collectives/topology.h"

namespace emu::coll {
namespace {

void run(AlgorithmContext& context, const Call& call) {
  const int n = context.size();
  const int r = context.rank();
  const DType dtype = call.dtype;
  copy(dtype, call.send, call.recv, call.count);
  if (n == 1 || call.count == 0) return;
  const Blocks blocks = Blocks::even(call.count, n);
  // scratch: [min(largest block, slice)] elements, where each received slice lands before it is added.
  Buffer scratch = context.scratch(blocks.largest, 1, dtype, "ring all_reduce scratch");
  void* data = call.recv;
  for (int step = 0; step < n - 1; ++step) {
    const auto a = static_cast<size_t>(ring_rs_send_block(r, step, n));
    const auto b = static_cast<size_t>(ring_rs_recv_block(r, step, n));
    const Transfer transfer{at(data, blocks.offset[a], dtype), blocks.count[a], ring_next(r, n), static_cast<int>(a),
                            at(data, blocks.offset[b], dtype), blocks.count[b], ring_prev(r, n), static_cast<int>(b)};
    exchange_reduce(context, dtype, call.op, fmt::format("reduce-scatter step {}/{}", step + 1, n - 1), transfer,
                    transfer.recv, scratch.data());
  }
  for (int step = 0; step < n - 1; ++step) {
    const auto a = static_cast<size_t>(ring_ag_send_block(r, step, n));
    const auto b = static_cast<size_t>(ring_ag_recv_block(r, step, n));
    const Transfer transfer{at(data, blocks.offset[a], dtype), blocks.count[a], ring_next(r, n), static_cast<int>(a),
                            at(data, blocks.offset[b], dtype), blocks.count[b], ring_prev(r, n), static_cast<int>(b)};
    exchange_copy(context, dtype, fmt::format("all-gather step {}/{}", step + 1, n - 1), transfer);
  }
}

// Reduce-scatter: sends every block but r, receives every block but r-1. All-gather: sends every block but r+1,
// receives every block but r.
Expectation expect(const Call& call, int r, int n, size_t slice_bytes, int /*ranks_per_node*/) {
  if (n == 1 || call.count == 0) return {};
  const BlockView blocks = BlockView::even(call.count, n);
  const uint64_t e = dtype_size(call.dtype);
  const auto block = [&](int i) { return blocks.count(wrap(i, n)) * e; };
  const uint64_t total = blocks.total() * e;
  Expectation expectation;
  expectation.traffic.sent = 2 * total - block(r) - block(r + 1);
  expectation.traffic.received = 2 * total - block(r - 1) - block(r);
  expectation.buffer_bytes = std::min(blocks.largest(), slice_elements(slice_bytes, call.dtype)) * e;
  return expectation;
}

Cost cost(double s, int n, int /*ranks_per_node*/) {
  const double m = n - 1;
  return {2 * m, 2 * m / n * s, m / n * s, "2(N-1) α + 2(N-1)/N S β + (N-1)/N S γ"};
}

}  // namespace

extern const Algorithm kRingAllReduce{CollectiveKind::kAllReduce,
                                      "ring",
                                      "reduce-scatter then all-gather around a ring; 2(N-1)/N of the buffer per rank",
                                      run,
                                      expect,
                                      cost};

}  // namespace emu::coll
