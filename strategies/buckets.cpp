#include "strategies/buckets.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <utility>

namespace emu::strategy {

std::vector<Bucket> assign_buckets(std::span<const size_t> param_bytes, size_t first_bucket_bytes,
                                   size_t bucket_bytes) {
  std::vector<Bucket> buckets;
  Bucket open;
  for (size_t i = param_bytes.size(); i-- > 0;) {
    open.params.push_back(i);
    open.bytes += param_bytes[i];
    const size_t limit = buckets.empty() ? first_bucket_bytes : bucket_bytes;
    if (open.bytes >= limit) {
      buckets.push_back(std::move(open));
      open = Bucket{};
    }
  }
  if (!open.params.empty()) buckets.push_back(std::move(open));
  return buckets;
}

std::vector<std::vector<size_t>> deepspeed_allreduce_buckets(std::span<const uint64_t> elements, uint64_t limit) {
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> open;
  uint64_t held = 0;
  for (size_t i = 0; i < elements.size(); ++i) {
    open.push_back(i);
    held += elements[i];
    if (held > limit) {
      buckets.push_back(std::move(open));
      open = {};
      held = 0;
    }
  }
  if (!open.empty()) buckets.push_back(std::move(open));
  return buckets;
}

std::vector<int> zero_redundancy_owners(std::span<const uint64_t> elements, int ranks) {
  std::vector<size_t> order(elements.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return elements[a] > elements[b]; });
  // The rank with the fewest elements so far, the lowest such rank on a tie: the top of a min-heap of (elements,
  // rank), so that a plan of a million ranks does not scan them all for each tensor.
  using Load = std::pair<uint64_t, int>;
  std::vector<Load> loads;
  loads.reserve(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) loads.emplace_back(0, r);
  std::priority_queue<Load, std::vector<Load>, std::greater<>> least(std::greater<>{}, std::move(loads));
  std::vector<int> owner(elements.size(), 0);
  for (size_t i : order) {
    auto [held, rank] = least.top();
    least.pop();
    owner[i] = rank;
    least.emplace(held + elements[i], rank);
  }
  return owner;
}

int zero_redundancy_busiest(std::span<const uint64_t> elements, int ranks, int first, int last) {
  const std::vector<int> owner = zero_redundancy_owners(elements, ranks);
  std::vector<uint64_t> held(static_cast<size_t>(ranks), 0);
  for (size_t i = 0; i < elements.size(); ++i) held[static_cast<size_t>(owner[i])] += elements[i];
  const auto begin = held.begin() + first;
  return first + static_cast<int>(std::max_element(begin, held.begin() + last + 1) - begin);
}

}  // namespace emu::strategy
