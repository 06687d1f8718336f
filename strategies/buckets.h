// Gradient buckets as PyTorch DDP assigns them.
//
// Parameters are taken in reverse order of registration (the order their gradients become ready in backward).
// Each is added whole to the open bucket; once the bucket holds at least its limit it closes and the next one
// opens. The first bucket's limit is small (DDP: 1 MiB) so that communication starts early; the others use the
// bucket cap (DDP: 25 MiB). emu scales both by 1/k^2 like every other memory term.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace emu::strategy {

struct Bucket {
  std::vector<size_t> params;  // indices into the registration-order list, in the order they were added
  size_t bytes = 0;            // sum of their sizes
};

// `param_bytes` in registration order. Every parameter lands in exactly one bucket.
std::vector<Bucket> assign_buckets(std::span<const size_t> param_bytes, size_t first_bucket_bytes, size_t bucket_bytes);

// DeepSpeed's stage-0 gradient all-reduce (runtime/engine.py allreduce_gradients → buffered_allreduce_fallback →
// allreduce_no_retain): the module's parameters in registration order, each added whole to the open bucket, which
// is flattened and all-reduced once it holds more than `limit` elements (MEMORY_OPT_ALLREDUCE_SIZE, 500,000,000:
// engine.py passes no config key), and the rest at the end. `elements` in registration order; returns each bucket's
// tensor indices.
inline constexpr uint64_t kDeepSpeedAllreduceElements = 500'000'000;
std::vector<std::vector<size_t>> deepspeed_allreduce_buckets(std::span<const uint64_t> elements, uint64_t limit);

// PyTorch ZeroRedundancyOptimizer's partition of whole parameter tensors over `ranks` ranks
// (torch/distributed/optim/zero_redundancy_optimizer.py, _partition_parameters): the tensors sorted by element
// count, largest first (a stable sort: equal sizes keep registration order), each given to the rank with the
// fewest elements so far (the lowest such rank). `elements` in registration order; returns the owner of each.
std::vector<int> zero_redundancy_owners(std::span<const uint64_t> elements, int ranks);
// Of ranks first..last, the one that partition gives the most elements (the lowest such rank on a tie): the rank
// whose optimizer state, and so whose peak, is the largest among them.
int zero_redundancy_busiest(std::span<const uint64_t> elements, int ranks, int first, int last);

}  // namespace emu::strategy
