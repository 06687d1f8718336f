// ZeRO-1 and ZeRO-2's predicted memory and traffic (zero12.cpp runs them), after the ZeRO paper's
// (2 + 2 + K/N)Ψ and (2 + (2 + K)/N)Ψ plus DeepSpeed's buffers.
//
// The flat space of Ψ parameters is padded to P, a multiple of N, and cut into shards of S = P/N. Per rank:
//   stage 1  parameters P · parameter bytes   gradients P · gradient bytes
//   stage 2  parameters P · parameter bytes   gradients S · gradient bytes for the partition, plus the root's and
//            the largest block's gradients while backward makes them (the root's backward encloses the blocks')
//            reduce bucket B · gradient bytes (two with overlap_comm), B = the reduce bucket size, at least the
//            largest unit and at most P
//   both     master weights and Adam moments over the S elements this rank updates
// Traffic per step: the gradients reduce-scattered (stage 1: P once, after the last micro-batch; stage 2: Ψ every
// micro-batch, padding never reduced), the updated shards all-gathered (P), the gradient norm all-reduced.
#include <algorithm>

#include "strategies/analytic.h"

namespace emu::strategy {

Updated predict_zero12(const StrategyOptions& options, const AnalyticInput& input, int stage, Prediction& prediction) {
  const int world = input.world;
  const uint64_t parameters = input.parameter_count();
  const uint64_t padded_parameters = padded_elements(parameters, world);
  const uint64_t shard_elements = padded_parameters / world;
  const uint64_t grad_bytes = dtype_size(options.recipe.grads);
  const DType grads = options.recipe.grads;
  const int all = AnalyticInput::kAllUnits;
  prediction.peak[Category::kParameters] = input.bytes(all, padded_parameters, options.recipe.params);
  if (stage == 1) {
    prediction.peak[Category::kGradients] = input.bytes(all, padded_parameters, grads);
    prediction.formula = "(2 + 2 + K/N)Ψ: optimizer state partitioned";
    add_ring_traffic(prediction, coll::CollectiveKind::kReduceScatter, "world", padded_parameters * grad_bytes, world);
  } else {
    const uint64_t root = input.unit_counts.front();
    const auto largest = std::max_element(input.unit_counts.begin() + 1, input.unit_counts.end());
    const uint64_t largest_block = *largest;
    const int largest_unit_index = static_cast<int>(largest - input.unit_counts.begin());
    const uint64_t largest_unit = std::max(root, largest_block);
    const uint64_t reduce_bucket = options.scaled(options.zero.reduce_bucket_elements);
    const uint64_t bucket_elements =
        std::min<uint64_t>(std::max<uint64_t>(largest_unit, reduce_bucket), padded_parameters);
    // A bucket sized by the parameters is charged as they are; one of reduce_bucket_size is already ÷ k².
    const uint64_t bucket_bytes =
        bucket_elements == reduce_bucket ? bucket_elements * grad_bytes : input.bytes(all, bucket_elements, grads);
    prediction.peak[Category::kGradients] = input.bytes(all, shard_elements, grads) + input.bytes(0, root, grads) +
                                            input.bytes(largest_unit_index, largest_block, grads);
    prediction.peak[Category::kBuckets] = bucket_bytes * (options.zero.overlap_comm ? 2 : 1);
    prediction.formula = "(2 + (2 + K)/N)Ψ: optimizer state and gradients partitioned";
    add_ring_traffic(prediction, coll::CollectiveKind::kReduceScatter, "world", parameters * grad_bytes, world,
                     static_cast<uint64_t>(input.accumulation));
  }
  add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, "world",
                   padded_parameters * dtype_size(options.recipe.params), world);
  add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "world", 4,
                   world);  // the gradient norm's partial sums
  return {{all, shard_elements}};
}

}  // namespace emu::strategy
