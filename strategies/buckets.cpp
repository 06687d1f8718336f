#include "strategies/buckets.h"

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

}  // namespace emu::strategy
