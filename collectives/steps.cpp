#include "collectives/steps.h"

#include <algorithm>
#include <cstring>

#include "collectives/reduce.h"

namespace emu::coll {
namespace {

size_t slices_of(size_t count, size_t slice) { return (count + slice - 1) / slice; }
size_t slice_at(size_t count, size_t index, size_t slice) {
  const size_t begin = index * slice;
  return begin >= count ? 0 : std::min(slice, count - begin);
}

void log_step(AlgorithmContext& context, DType dtype, std::string_view stage, const Transfer& t, bool reduced) {
  if (context.record == nullptr) return;
  const size_t element = dtype_size(dtype);
  const bool sends = t.send_count > 0 && t.to != kNoPeer;
  const bool receives = t.recv_count > 0 && t.from != kNoPeer;
  context.record->push_back(StepRecord{std::string(stage), sends ? t.to : kNoPeer, t.send_block,
                                       sends ? t.send_count * element : 0, receives ? t.from : kNoPeer, t.recv_block,
                                       receives ? t.recv_count * element : 0, reduced && receives, t.send_offset,
                                       t.recv_offset});
}

// Runs the exchange slice by slice; after slice i arrives at recv_slice(i), on_received(i, elements) runs.
template <typename RecvSlice, typename OnReceived>
void sliced(AlgorithmContext& context, DType dtype, const Transfer& t, RecvSlice recv_slice, OnReceived on_received) {
  const size_t element = dtype_size(dtype);
  const size_t slice = slice_elements(context.slice_bytes, dtype);
  const int to = t.send_count > 0 ? t.to : kNoPeer;
  const int from = t.recv_count > 0 ? t.from : kNoPeer;
  const size_t send_count = to == kNoPeer ? 0 : t.send_count;
  const size_t recv_count = from == kNoPeer ? 0 : t.recv_count;
  const size_t n = std::max(slices_of(send_count, slice), slices_of(recv_count, slice));
  for (size_t i = 0; i < n; ++i) {
    const size_t s = slice_at(send_count, i, slice);
    const size_t r = slice_at(recv_count, i, slice);
    context.link.exchange(at(t.send, i * slice, dtype), s * element, s > 0 ? to : kNoPeer, recv_slice(i, slice),
                          r * element, r > 0 ? from : kNoPeer);
    if (r > 0) on_received(i * slice, r);
  }
  context.moved.sent += send_count * element;
  context.moved.received += recv_count * element;
  const int node = context.node_of(context.rank());
  if (to != kNoPeer && context.node_of(to) != node) context.moved_between_nodes.sent += send_count * element;
  if (from != kNoPeer && context.node_of(from) != node) context.moved_between_nodes.received += recv_count * element;
}

}  // namespace

void copy(DType dtype, const void* from, void* to, size_t count) {
  if (from != to && count > 0) std::memmove(to, from, count * dtype_size(dtype));
}

void exchange_copy(AlgorithmContext& context, DType dtype, std::string_view stage, const Transfer& transfer) {
  log_step(context, dtype, stage, transfer, false);
  sliced(
      context, dtype, transfer, [&](size_t i, size_t slice) { return at(transfer.recv, i * slice, dtype); },
      [](size_t, size_t) {});
}

void exchange_reduce(AlgorithmContext& context, DType dtype, ReduceOp op, std::string_view stage,
                     const Transfer& transfer, const void* addend, void* scratch) {
  log_step(context, dtype, stage, transfer, true);
  sliced(
      context, dtype, transfer, [&](size_t, size_t) { return scratch; },
      [&](size_t offset, size_t count) {
        reduce(dtype, op, at(addend, offset, dtype), scratch, at(transfer.recv, offset, dtype), count);
      });
}

}  // namespace emu::coll
