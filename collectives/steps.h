// The moves algorithms are made of: an exchange with one or two peers, copied or reduced, cut into slices.
//
// Every byte an algorithm sends or receives goes through these helpers, which count it in AlgorithmContext::moved and,
// for the teaching view, log one StepRecord per exchange. Messages are cut into slices of at most slice_bytes; both
// ranks of an exchange cut the same sizes the same way, so the slices pair up in order.
#pragma once

#include <string_view>

#include "collectives/algorithm.h"

namespace emu::coll {

// One exchange: `send_count` elements at `send` to `to`, `recv_count` elements from `from` into `recv`.
// A side with a zero count or kNoPeer is skipped. Blocks are labels for the teaching view only.
struct Transfer {
  const void* send = nullptr;
  size_t send_count = 0;
  int to = kNoPeer;
  int send_block = -1;
  void* recv = nullptr;
  size_t recv_count = 0;
  int from = kNoPeer;
  int recv_block = -1;
  int64_t send_offset = -1;  // for the teaching view: elements into the collective's buffer, where not a block
  int64_t recv_offset = -1;
};

// Receives straight into `recv`.
void exchange_copy(AlgorithmContext& context, DType dtype, std::string_view stage, const Transfer& transfer);

// Receives each slice into `scratch` (at least min(recv_count, slice) elements), then recv = addend op slice.
// `addend` may equal `recv` (accumulate in place).
void exchange_reduce(AlgorithmContext& context, DType dtype, ReduceOp op, std::string_view stage,
                     const Transfer& transfer, const void* addend, void* scratch);

// Pointer arithmetic in elements; a null base (nothing held) stays null.
inline const void* at(const void* base, size_t elements, DType dtype) {
  return base == nullptr ? nullptr : static_cast<const char*>(base) + elements * dtype_size(dtype);
}
inline void* at(void* base, size_t elements, DType dtype) {
  return base == nullptr ? nullptr : static_cast<char*>(base) + elements * dtype_size(dtype);
}
// Copies `count` elements (no-op when the buffers are the same).
void copy(DType dtype, const void* from, void* to, size_t count);

}  // namespace emu::coll
