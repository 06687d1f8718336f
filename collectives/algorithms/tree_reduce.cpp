// Binomial-tree reduce: the broadcast tree walked backwards. A rank adds each child's partial sum to its own,
// smallest subtree first (it finishes first), then sends the result to its parent. Inner ranks other than the
// root accumulate in a communication buffer of the whole size, so their input stays untouched.
#include <fmt/format.h>

#include <algorithm>

#include "collectives/algorithm.h"
#include "collectives/steps.h"
#include "collectives/topology.h"

namespace emu::coll {
namespace {

void run(AlgorithmContext& context, const Call& call) {
  const int n = context.size();
  const int v = wrap(context.rank() - call.root, n);
  const auto real = [&](int relative) { return wrap(relative + call.root, n); };
  const DType dtype = call.dtype;
  if (n == 1) {
    copy(dtype, call.send, call.recv, call.count);
    return;
  }
  if (call.count == 0) return;
  std::vector<int> children = binomial_children(v, n);
  std::reverse(children.begin(), children.end());
  const void* partial = call.send;
  Buffer accumulator;
  Buffer scratch;
  if (!children.empty()) {
    // accumulator: [count] on inner ranks; the root accumulates in its output.
    void* sum = call.recv;
    if (v != 0) {
      accumulator = context.buffer(call.count, dtype, "tree reduce accumulator");
      sum = accumulator.data();
    }
    copy(dtype, call.send, sum, call.count);
    // scratch: [min(count, slice)] for each received slice before it is added.
    scratch = context.scratch(call.count, 1, dtype, "tree reduce scratch");
    for (int child : children) {
      Transfer transfer;
      transfer.recv = sum;
      transfer.recv_count = call.count;
      transfer.from = real(child);
      exchange_reduce(context, dtype, call.op, fmt::format("add subtree of r{}", real(child)), transfer, sum,
                      scratch.data());
    }
    partial = sum;
  }
  if (v != 0) {
    Transfer transfer;
    transfer.send = partial;
    transfer.send_count = call.count;
    transfer.to = real(binomial_parent(v));
    exchange_copy(context, dtype, "send to parent", transfer);
  }
}

Expectation expect(const Call& call, int rank, int n, size_t slice_bytes, int /*ranks_per_node*/) {
  if (n == 1 || call.count == 0) return {};
  const int v = wrap(rank - call.root, n);
  const uint64_t e = dtype_size(call.dtype);
  const uint64_t bytes = call.count * e;
  const size_t children = binomial_children(v, n).size();
  Expectation expectation;
  expectation.traffic.sent = v == 0 ? 0 : bytes;
  expectation.traffic.received = children * bytes;
  if (children > 0) {
    expectation.buffer_bytes = std::min(call.count, slice_elements(slice_bytes, call.dtype)) * e;
    if (v != 0) expectation.buffer_bytes += bytes;
  }
  return expectation;
}

// The root receives and adds the whole buffer once per round.
Cost cost(double s, int n, int /*ranks_per_node*/) {
  const double rounds = ceil_log2(n);
  return {rounds, rounds * s, rounds * s, "ceil(log2 N) (α + S β + S γ)"};
}

}  // namespace

extern const Algorithm kTreeReduce{CollectiveKind::kReduce,
                                   "tree",
                                   "binomial tree into the root; each rank but the root sends the buffer once",
                                   run,
                                   expect,
                                   cost};

}  // namespace emu::coll
