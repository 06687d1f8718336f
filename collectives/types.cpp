#include "collectives/types.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <numeric>

#include "emu/check.h"

namespace emu::coll {
namespace {
constexpr std::array<std::string_view, kNumKinds> kKindNames = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "barrier", "send", "recv",
};
constexpr std::array<std::string_view, 3> kOpNames = {"sum", "avg", "max"};
}  // namespace

std::string_view kind_name(CollectiveKind kind) { return kKindNames[static_cast<size_t>(kind)]; }

std::optional<CollectiveKind> parse_kind(std::string_view name) {
  for (size_t i = 0; i < kNumKinds; ++i) {
    if (kKindNames[i] == name) return kind_at(i);
  }
  return std::nullopt;
}

std::vector<std::pair<CollectiveKind, std::string_view>> parse_algorithm_list(std::string_view list) {
  std::vector<std::pair<CollectiveKind, std::string_view>> items;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    if (item.empty()) continue;
    const size_t equals = item.find('=');
    const auto kind = parse_kind(item.substr(0, equals));
    if (equals == std::string_view::npos || !kind) {
      throw InputError(
          fmt::format("'{}' in the algorithm list: expected <kind>=<algorithm>, kind one of "
                      "all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, barrier",
                      item));
    }
    items.emplace_back(*kind, item.substr(equals + 1));
  }
  return items;
}

std::string_view op_name(ReduceOp op) { return kOpNames[static_cast<size_t>(op)]; }

std::optional<ReduceOp> parse_op(std::string_view name) {
  for (size_t i = 0; i < kOpNames.size(); ++i) {
    if (kOpNames[i] == name) return static_cast<ReduceOp>(i);
  }
  return std::nullopt;
}

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "float32" || name == "fp32" || name == "float") return DType::kF32;
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  return std::nullopt;
}

size_t ShardWindow::count(int r) const {
  const size_t begin = std::max(lo, shard * static_cast<size_t>(r));
  const size_t end = std::min(hi, shard * (static_cast<size_t>(r) + 1));
  return end > begin ? end - begin : 0;
}

size_t ShardWindow::offset(int r) const { return std::clamp(shard * static_cast<size_t>(r), lo, hi) - lo; }

uint64_t payload_bytes(const Call& call, int size) {
  const uint64_t element = dtype_size(call.dtype);
  const uint64_t n = static_cast<uint64_t>(size);
  switch (call.kind) {
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
      if (call.window.active()) return element * (call.window.hi - call.window.lo);
      if (!call.counts.empty()) return element * std::accumulate(call.counts.begin(), call.counts.end(), uint64_t{0});
      return element * call.count * n;
    case CollectiveKind::kAllToAll: return element * call.count * n;
    case CollectiveKind::kBarrier: return 0;
    default: return element * call.count;
  }
}

double bus_factor(CollectiveKind kind, int size) {
  const double n = size;
  switch (kind) {
    case CollectiveKind::kAllReduce: return 2.0 * (n - 1) / n;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll: return (n - 1) / n;
    default: return 1.0;
  }
}

}  // namespace emu::coll
