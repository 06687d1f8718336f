// Ring reduce, as NCCL runs ncclReduce: a chain along the ring that ends at the root. Rank root+1 sends its buffer
// to root+2, each rank after it adds its own buffer to what arrives and passes the sum on, and the root adds its own
// into its output. The message goes piece by piece (one slice each), so a middle rank sends piece j−1 while piece j
// arrives and holds two slices, never the whole buffer; inputs stay untouched and only the root writes its output.
// Every rank but the root sends the buffer once, every rank but root+1 receives it once: NCCL's bus bandwidth for
// reduce is its algorithm bandwidth (nccl-tests, doc/PERFORMANCE.md: factor 1).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "collectives/algorithm.h"
#include "collectives/steps.h"
#include "collectives/topology.h"

namespace emu::coll {
namespace {

// The rank's place in the chain: 0 for root+1, which starts it, up to N−1 for the root, which ends it.
int chain_position(int rank, int root, int n) { return wrap(rank - root - 1, n); }

void run(AlgorithmContext& context, const Call& call) {
  const int n = context.size();
  const int r = context.rank();
  const DType dtype = call.dtype;
  if (n == 1) {
    copy(dtype, call.send, call.recv, call.count);
    return;
  }
  if (call.count == 0) return;
  const int position = chain_position(r, call.root, n);
  const bool starts = position == 0;
  const bool ends = position == n - 1;
  const size_t slice = slice_elements(context.slice_bytes, dtype);
  const size_t pieces = (call.count + slice - 1) / slice;
  const auto piece = [&](size_t j) { return std::min(slice, call.count - j * slice); };
  // arrived: [min(count, slice)] where each piece lands before it is added; a middle rank also sums piece j into
  // `summed` and sends it on in its next exchange, while piece j+1 arrives.
  Buffer buffers;
  if (!starts) buffers = context.scratch(call.count, ends ? 1 : 2, dtype, "ring reduce pieces");
  void* arrived = buffers.data();
  void* summed = ends ? nullptr : at(buffers.data(), std::min(call.count, slice), dtype);
  for (size_t j = 0; j <= pieces; ++j) {
    Transfer transfer;
    if (starts && j < pieces) {
      transfer.send = at(call.send, j * slice, dtype);
      transfer.send_count = piece(j);
    } else if (!starts && !ends && j > 0) {
      transfer.send = summed;
      transfer.send_count = piece(j - 1);
    }
    if (transfer.send_count > 0) {
      transfer.to = ring_next(r, n);
      transfer.send_offset = static_cast<int64_t>((starts ? j : j - 1) * slice);
    }
    if (!starts && j < pieces) {
      transfer.recv = ends ? at(call.recv, j * slice, dtype) : summed;
      transfer.recv_count = piece(j);
      transfer.from = ring_prev(r, n);
      transfer.recv_offset = static_cast<int64_t>(j * slice);
    }
    if (transfer.send_count == 0 && transfer.recv_count == 0) continue;
    const std::string stage = pieces > 1                ? fmt::format("piece {}/{}", std::min(j + 1, pieces), pieces)
                              : starts                  ? std::string("start the chain")
                              : transfer.recv_count > 0 ? fmt::format("add r{}'s", transfer.from)
                                                        : std::string("send the sum on");
    if (starts) {
      exchange_copy(context, dtype, stage, transfer);
    } else {
      exchange_reduce(context, dtype, call.op, stage, transfer, at(call.send, j * slice, dtype), arrived);
    }
  }
}

Expectation expect(const Call& call, int rank, int n, size_t slice_bytes, int /*ranks_per_node*/) {
  if (n == 1 || call.count == 0) return {};
  const int position = chain_position(rank, call.root, n);
  const uint64_t e = dtype_size(call.dtype);
  const uint64_t bytes = call.count * e;
  const uint64_t slice = std::min(call.count, slice_elements(slice_bytes, call.dtype)) * e;
  Expectation expectation;
  expectation.traffic.sent = position == n - 1 ? 0 : bytes;
  expectation.traffic.received = position == 0 ? 0 : bytes;
  if (position == n - 1) expectation.buffer_bytes = slice;
  if (position > 0 && position < n - 1) expectation.buffer_bytes = 2 * slice;
  return expectation;
}

// Cut into k pieces of one slice each (the last one shorter), as NCCL pipelines the chain: piece j leaves root+1 in
// round j+1 and reaches the root N−1 rounds later, so N+k−2 rounds; a middle rank receives the first piece alone,
// then sends one while the next arrives, and sends the last alone: S plus one piece on its links (2S for one
// piece), S on root+1's and the root's. The root adds S.
Cost sliced_cost(double s, int n, int /*ranks_per_node*/, double slice_bytes) {
  const double pieces = slice_bytes > 0 && s > slice_bytes ? std::ceil(s / slice_bytes) : 1;
  const double piece = std::min(s, slice_bytes > 0 ? slice_bytes : s);
  if (n <= 1) return {0, 0, 0, "0"};
  if (n == 2) return {pieces, s, s, "k α + S β + S γ (k pieces of one slice)"};
  return {n - 2 + pieces, s + piece, s, "(N+k-2) α + (S + S/k) β + S γ (k pieces of one slice)"};
}

// One piece, as the model follows every algorithm: N−1 hops one after another, a middle rank receiving it whole
// before it sends it on (2S on its links).
Cost cost(double s, int n, int ranks_per_node) { return sliced_cost(s, n, ranks_per_node, s); }

}  // namespace

extern const Algorithm kRingReduce{CollectiveKind::kReduce,
                                   "ring",
                                   "a chain along the ring into the root, piece by piece; S per rank but the root",
                                   run,
                                   expect,
                                   cost,
                                   sliced_cost};

}  // namespace emu::coll
