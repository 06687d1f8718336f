#include "collectives/verify.h"

#include <algorithm>

#include "collectives/reduce.h"
#include "collectives/topology.h"
#include "emu/bf16.h"

namespace emu::coll {
namespace {
constexpr float kPoison = -1.0f;  // never an answer: inputs and their reductions are >= 0
}

VerifiedCase::VerifiedCase(Device& device, CollectiveKind kind, DType dtype, ReduceOp op, size_t count,
                           std::vector<size_t> counts, int root, bool in_place, int rank, int size)
    : kind_(kind),
      dtype_(dtype),
      op_(op),
      count_(count),
      counts_(std::move(counts)),
      root_(root),
      in_place_(in_place),
      rank_(rank),
      size_(size) {
  const Blocks blocks = counts_.empty() ? Blocks::uniform(count, size) : Blocks::of(counts_);
  const auto mine = static_cast<size_t>(rank);
  size_t send_count = count;
  size_t recv_count = count;
  switch (kind) {
    case CollectiveKind::kReduceScatter: send_count = blocks.total, recv_count = blocks.count[mine]; break;
    case CollectiveKind::kAllGather: send_count = blocks.count[mine], recv_count = blocks.total; break;
    case CollectiveKind::kAllToAll: send_count = recv_count = count * static_cast<size_t>(size); break;
    case CollectiveKind::kBarrier: send_count = recv_count = 0; break;
    default: break;
  }
  const bool reduces =
      kind == CollectiveKind::kAllReduce || kind == CollectiveKind::kReduceScatter || kind == CollectiveKind::kReduce;
  call_ = Call{kind,
               nullptr,
               nullptr,
               counts_.empty() ? count : blocks.count[mine],
               {},
               dtype,
               reduces ? op : ReduceOp::kSum,
               kind == CollectiveKind::kBroadcast || kind == CollectiveKind::kReduce ? root : 0,
               {}};
  if (!counts_.empty()) call_.counts = counts_;
  if (in_place) {
    // One buffer; the rank's part sits where the in-place conventions put it (types.h).
    send_ = device.allocate(std::max(send_count, recv_count), dtype, Category::kTemporaries, "verified in-place");
    call_.send = send_.data();
    call_.recv = send_.data();
    if (kind == CollectiveKind::kReduceScatter)
      call_.recv = static_cast<char*>(send_.data()) + blocks.offset[mine] * dtype_size(dtype);
    if (kind == CollectiveKind::kAllGather)
      call_.send = static_cast<char*>(send_.data()) + blocks.offset[mine] * dtype_size(dtype);
  } else {
    send_ = device.allocate(send_count, dtype, Category::kTemporaries, "verified input");
    recv_ = device.allocate(recv_count, dtype, Category::kTemporaries, "verified output");
    call_.send = send_.data();
    call_.recv = recv_.data();
  }
  reset();
}

float VerifiedCase::input(int rank, size_t index) const { return verify_value(rank, index); }

void VerifiedCase::store(void* data, size_t index, float value) const {
  if (dtype_ == DType::kF32) {
    static_cast<float*>(data)[index] = value;
  } else {
    static_cast<uint16_t*>(data)[index] = float_to_bf16(value);
  }
}

float VerifiedCase::load(const void* data, size_t index) const {
  return dtype_ == DType::kF32 ? static_cast<const float*>(data)[index]
                               : bf16_to_float(static_cast<const uint16_t*>(data)[index]);
}

void VerifiedCase::reset() {
  const Blocks blocks = counts_.empty() ? Blocks::uniform(count_, size_) : Blocks::of(counts_);
  const auto mine = static_cast<size_t>(rank_);
  if (in_place_) {
    // Poison the whole buffer, then write this rank's input where the call reads it.
    for (size_t i = 0; i < send_.count(); ++i) store(send_.data(), i, kPoison);
  } else {
    for (size_t i = 0; i < recv_.count(); ++i) store(recv_.data(), i, kPoison);
  }
  void* send = const_cast<void*>(call_.send);
  switch (kind_) {
    case CollectiveKind::kAllGather:
      for (size_t i = 0; i < blocks.count[mine]; ++i) store(send, i, input(rank_, blocks.offset[mine] + i));
      break;
    case CollectiveKind::kBroadcast:
      if (rank_ == root_) {
        for (size_t i = 0; i < count_; ++i) store(send, i, input(rank_, i));
      }
      break;
    case CollectiveKind::kBarrier: break;
    default: {
      const size_t n = kind_ == CollectiveKind::kReduceScatter ? blocks.total
                       : kind_ == CollectiveKind::kAllToAll    ? count_ * static_cast<size_t>(size_)
                                                               : count_;
      for (size_t i = 0; i < n; ++i) store(send, i, input(rank_, i));
    }
  }
}

uint64_t VerifiedCase::wrong() const {
  const Blocks blocks = counts_.empty() ? Blocks::uniform(count_, size_) : Blocks::of(counts_);
  const auto mine = static_cast<size_t>(rank_);
  // The answer for element `index` of the reduced vector, exactly as the kernels would round it.
  const auto reduced = [&](size_t index) {
    float sum = 0;
    float max = input(0, index);
    for (int r = 0; r < size_; ++r) {
      sum += input(r, index);
      max = std::max(max, input(r, index));
    }
    if (op_ == ReduceOp::kMax) return max;
    if (op_ == ReduceOp::kSum) return sum;
    float average = dtype_ == DType::kBF16 ? round_to_bf16(sum) : sum;
    divide(DType::kF32, &average, 1, size_);
    return average;
  };
  const auto answer = [&](size_t i) -> float {
    switch (kind_) {
      case CollectiveKind::kAllReduce:
      case CollectiveKind::kReduce: return reduced(i);
      case CollectiveKind::kReduceScatter: return reduced(blocks.offset[mine] + i);
      case CollectiveKind::kAllGather:
        return input(
            static_cast<int>(std::upper_bound(blocks.offset.begin(), blocks.offset.end(), i) - blocks.offset.begin()) -
                1,
            i);
      case CollectiveKind::kBroadcast: return input(root_, i);
      case CollectiveKind::kAllToAll: {
        const size_t from = i / count_;
        return input(static_cast<int>(from), mine * count_ + i % count_);
      }
      default: return 0;
    }
  };
  size_t n = 0;
  switch (kind_) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast: n = count_; break;
    case CollectiveKind::kReduce: n = rank_ == root_ ? count_ : 0; break;
    case CollectiveKind::kReduceScatter: n = blocks.count[mine]; break;
    case CollectiveKind::kAllGather: n = blocks.total; break;
    case CollectiveKind::kAllToAll: n = count_ * static_cast<size_t>(size_); break;
    default: break;
  }
  uint64_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    float expected = answer(i);
    if (dtype_ == DType::kBF16) expected = round_to_bf16(expected);
    if (load(call_.recv, i) != expected) ++wrong;
  }
  return wrong;
}

}  // namespace emu::coll
