// Ring reduce-scatter: after N-1 steps rank r holds block r summed over all ranks. The input stays untouched:
// partial sums travel in two staging slices, and the buffer is walked one column of slices at a time (slice j of
// every block), so the staging never exceeds two slices however large the blocks. Blocks may differ in size
// (the uneven variant); each rank sends every block but its own, (N-1)/N of the input when sizes are equal.
#include <fmt/format.h>

#include <algorithm>

#include "collectives/algorithm.h"
#include "collectives/steps.h"
#include "collectives/topology.h"

namespace emu::coll {
namespace {

// Elements of slice `column` of a block of `count` elements, slices of `slice` elements.
size_t column_part(size_t count, size_t column, size_t slice) {
  const size_t begin = column * slice;
  return begin >= count ? 0 : std::min(slice, count - begin);
}

void run(AlgorithmContext& context, const Call& call) {
  const int n = context.size();
  const int r = context.rank();
  const DType dtype = call.dtype;
  const Blocks blocks = Blocks::of(call, n);
  const auto mine = static_cast<size_t>(r);
  if (n == 1) {
    copy(dtype, at(call.send, blocks.offset[mine], dtype), call.recv, blocks.count[mine]);
    return;
  }
  if (blocks.largest == 0) return;
  const size_t slice = std::min(blocks.largest, slice_elements(context.slice_bytes, dtype));
  // staging: [2][slice] elements; step s receives into and sums in half s % 2 while half (s-1) % 2 is sent.
  Buffer staging = context.scratch(blocks.largest, 2, dtype, "ring reduce_scatter staging");
  void* halves[2] = {staging.data(), at(staging.data(), slice, dtype)};
  const size_t columns = (blocks.largest + slice - 1) / slice;
  for (size_t column = 0; column < columns; ++column) {
    for (int step = 0; step < n - 1; ++step) {
      const auto a = static_cast<size_t>(ring_rs_send_block(r, step, n));
      const auto b = static_cast<size_t>(ring_rs_recv_block(r, step, n));
      const size_t in_column = column * slice;
      const void* send = step == 0 ? at(call.send, blocks.offset[a] + in_column, dtype) : halves[(step - 1) % 2];
      void* result = step == n - 2 ? at(call.recv, in_column, dtype) : halves[step % 2];
      const Transfer transfer{
          send,   column_part(blocks.count[a], column, slice), ring_next(r, n), static_cast<int>(a),
          result, column_part(blocks.count[b], column, slice), ring_prev(r, n), static_cast<int>(b)};
      exchange_reduce(context, dtype, call.op, fmt::format("reduce-scatter step {}/{}", step + 1, n - 1), transfer,
                      at(call.send, blocks.offset[b] + in_column, dtype), halves[step % 2]);
    }
  }
}

Expectation expect(const Call& call, int r, int n, size_t slice_bytes, int /*ranks_per_node*/) {
  const BlockView blocks = blocks_of(call, n);
  if (n == 1 || blocks.largest() == 0) return {};
  const uint64_t e = dtype_size(call.dtype);
  const auto block = [&](int i) { return blocks.count(wrap(i, n)) * e; };
  Expectation expectation;
  expectation.traffic.sent = blocks.total() * e - block(r);
  expectation.traffic.received = blocks.total() * e - block(r - 1);
  expectation.buffer_bytes = 2 * std::min(blocks.largest(), slice_elements(slice_bytes, call.dtype)) * e;
  return expectation;
}

Cost cost(double s, int n, int /*ranks_per_node*/) {
  const double m = n - 1;
  return {m, m / n * s, m / n * s, "(N-1) α + (N-1)/N S β + (N-1)/N S γ"};
}

}  // namespace

extern const Algorithm kRingReduceScatter{CollectiveKind::kReduceScatter,
                                          "ring",
                                          "partial sums passed around a ring; (N-1)/N of the input per rank",
                                          run,
                                          expect,
                                          cost};

}  // namespace emu::coll
