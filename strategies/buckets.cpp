#include "strategies/buckets.h"

#include <algorithm>
#include <numeric>

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

std::vector<int> zero_redundancy_owners(std::span<const uint64_t> elements, int ranks) {
  std::vector<size_t> order(elements.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return elements[a] > elements[b]; });
  std::vector<uint64_t> sizes(static_cast<size_t>(ranks), 0);
  std::vector<int> owner(elements.size(), 0);
  for (size_t i : order) {
    const auto least = std::min_element(sizes.begin(), sizes.end());
    owner[i] = static_cast<int>(least - sizes.begin());
    *least += elements[i];
  }
  return owner;
}

}  // namespace emu::strategy
