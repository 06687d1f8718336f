// Verifiable collectives: inputs whose every reduction is exact, and a check of the outputs against the answer.
//
// Element k of rank r's input is value(r, k), a small integer (0..10), so sums over up to 23 ranks are exact in
// bf16 (8 significant bits) whatever the order of the partial sums; averages are the exact sum divided once.
// Every algorithm must then produce the same bits as the answer computed here. Used by the tests and by the
// benchmark's #wrong column (as nccl-tests does).
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/types.h"
#include "emu/device.h"

namespace emu::coll {

inline float verify_value(int rank, size_t index) {
  return static_cast<float>((index * 7 + static_cast<size_t>(rank) * 3 + 1) % 11);
}

// The buffers and the call for one verifiable collective on this rank. Buffers come from the device as
// Category::kTemporaries (what the caller of a collective would hold on a GPU).
class VerifiedCase {
 public:
  // `counts` empty: even blocks of `count`; else the uneven reduce_scatter / all_gather blocks.
  VerifiedCase(Device& device, CollectiveKind kind, DType dtype, ReduceOp op, size_t count, std::vector<size_t> counts,
               int root, bool in_place, int rank, int size);

  const Call& call() const { return call_; }
  // Rewrites the inputs (and poisons the outputs), for a case run more than once or in place.
  void reset();
  // Elements of this rank's output that differ from the answer.
  uint64_t wrong() const;

 private:
  float input(int rank, size_t index) const;
  void store(void* data, size_t index, float value) const;
  float load(const void* data, size_t index) const;

  CollectiveKind kind_;
  DType dtype_;
  ReduceOp op_;
  size_t count_;
  std::vector<size_t> counts_;
  int root_;
  bool in_place_;
  int rank_;
  int size_;
  Buffer send_;
  Buffer recv_;
  Call call_;
};

}  // namespace emu::coll
