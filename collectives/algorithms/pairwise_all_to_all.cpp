// Pairwise all-to-all: in step s = 1 .. N-1 rank r sends its block for r+s and receives the block from r-s, so
// every pair meets exactly once and no rank waits on two peers. In place, the input is first copied to a
// communication buffer of the whole size, since blocks are overwritten before they are sent.
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
  const size_t count = call.count;
  Buffer staging;
  const void* source = call.send;
  if (call.send == call.recv && n > 1 && count > 0) {
    // staging: [N][count], a copy of the input.
    staging = context.buffer(count * static_cast<size_t>(n), dtype, "all_to_all in-place staging");
    copy(dtype, call.send, staging.data(), staging.count());
    source = staging.data();
  }
  const auto block = [&](int i) { return static_cast<size_t>(i) * count; };
  copy(dtype, at(source, block(r), dtype), at(call.recv, block(r), dtype), count);
  for (int step = 1; step < n; ++step) {
    const int to = wrap(r + step, n);
    const int from = wrap(r - step, n);
    const Transfer transfer{at(source, block(to), dtype),      count, to,   to,
                            at(call.recv, block(from), dtype), count, from, from};
    exchange_copy(context, dtype, fmt::format("pair step {}/{}", step, n - 1), transfer);
  }
}

Expectation expect(const Call& call, int, int n, size_t, int) {
  const uint64_t bytes = call.count * dtype_size(call.dtype) * static_cast<uint64_t>(n - 1);
  Expectation expectation;
  expectation.traffic = Traffic{bytes, bytes};
  if (call.send == call.recv && n > 1 && call.count > 0) {
    expectation.buffer_bytes = call.count * static_cast<uint64_t>(n) * dtype_size(call.dtype);
  }
  return expectation;
}

Cost cost(double s, int n, int /*ranks_per_node*/) {
  const double m = n - 1;
  return {m, m / n * s, 0, "(N-1) α + (N-1)/N S β"};
}

}  // namespace

extern const Algorithm kPairwiseAllToAll{CollectiveKind::kAllToAll,
                                         "pairwise",
                                         "N-1 steps, each rank meeting one peer per step; (N-1)/N of the buffer",
                                         run,
                                         expect,
                                         cost};

}  // namespace emu::coll
