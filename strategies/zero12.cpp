// ZeRO stages 1 and 2 as DeepSpeed runs them: the optimizer state (1), and the gradients too (2), partitioned
// over the ranks; the parameters stay whole on every rank.
//
// The flat space of all units (root, blocks 1..L) is padded to a multiple of N and cut into N equal shards
// (shard.h); rank r updates shard r. Per rank, with S = ⌈Ψ/N⌉:
//   stage 1  parameters [N·S] kParameters   gradients [N·S] kGradients   master, m, v [S]
//            after the last backward, the gradients are reduce-scattered (averaged) in reduce buckets: each
//            rank keeps its shard's average in place.
//   stage 2  parameters [N·S] kParameters   gradient partition [S] kGradients   master, m, v [S]
//            reduce bucket [B] kBuckets (two with overlap_comm, DeepSpeed's double buffer), B = the reduce
//            bucket size, at least one unit. Each unit's gradients are made in a temporary [n_u] buffer
//            (kGradients, as autograd's .grad), copied into the bucket when the unit's backward ends, and
//            freed; a full bucket is reduce-scattered to the owners at once, every micro-batch, and each rank
//            adds its part to its partition: the gradients it does not own are never kept.
// After AdamW each rank's updated shard is all-gathered (in all-gather buckets) into every rank's parameters.
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "emu/check.h"
#include "strategies/flat.h"
#include "strategies/shard.h"
#include "strategies/strategy.h"
#include "workloads/optim/adamw_state.h"

namespace emu::strategy {
namespace {

class PartitionedOptimizer final : public Strategy {
 public:
  PartitionedOptimizer(StrategyContext context, const StrategyOptions& options, int stage)
      : Strategy(context, options), stage_(stage) {}

  void setup() override {
    const optim::PrecisionRecipe& recipe = options_.recipe;
    flat_ = flat_layout(model_);
    shard_ = shard_of(flat_.total, world_.rank(), world_.size());
    params_ = model::allocate_parameter_space(device_, flat_.charge, shard_.padded, recipe.params,
                                              Category::kParameters, "ZeRO parameters");
    if (stage_ == 1) {
      grads_ = model::allocate_parameter_space(device_, flat_.charge, shard_.padded, recipe.grads, Category::kGradients,
                                               "ZeRO-1 gradients");
    } else {
      grads_ = model::allocate_parameter_space(device_, flat_.charge, shard_.shard, recipe.grads, Category::kGradients,
                                               "ZeRO-2 gradient partition");
      size_t largest = 0;
      for (size_t count : flat_.count) largest = std::max(largest, count);
      bucket_capacity_ = std::max<size_t>(largest, options_.scaled(options_.zero.reduce_bucket_elements));
      bucket_capacity_ = std::min(bucket_capacity_, shard_.padded);
      // Sized by the parameters (a unit, the flat space), or by reduce_bucket_size, already ÷ k².
      const bool by_parameters = bucket_capacity_ != options_.scaled(options_.zero.reduce_bucket_elements);
      const size_t bucket_bytes = by_parameters ? flat_.charge.bytes(bucket_capacity_, recipe.grads)
                                                : bucket_capacity_ * dtype_size(recipe.grads);
      for (int i = 0; i < (options_.zero.overlap_comm ? 2 : 1); ++i) {
        buckets_.push_back(device_.allocate(bucket_capacity_, recipe.grads, Category::kBuckets,
                                            fmt::format("ZeRO-2 reduce bucket {}", i), bucket_bytes));
      }
      unit_grads_.resize(static_cast<size_t>(model_.num_units()));
    }
    optimizer_ = std::make_unique<optim::AdamWState>(optimizer_device(), recipe, shard_.shard,
                                                     "ZeRO optimizer partition", flat_.charge);

    std::vector<float> master(device_.holds_data() ? shard_.shard : 0);  // host scratch: the shard's initial values
    for (int u = 0; u < model_.num_units(); ++u) {
      const size_t at = flat_.offset[u];
      init_into(model_, u, options_.seed, 0, flat_.count[u], element(params_.data(), recipe.params, at), recipe.params);
      size_t lo = 0, hi = 0;
      shard_.intersect(at, at + flat_.count[u], lo, hi);
      init_into(model_, u, options_.seed, lo - at, hi - lo,
                master.empty() ? nullptr : master.data() + (lo - shard_.offset), DType::kF32);
      auto decay = decay_ranges(model_.layout(u), at);
      decay_.insert(decay_.end(), decay.begin(), decay.end());
      model_.bind_weights(u, element(params_.data(), recipe.params, at));
      if (stage_ == 1) model_.bind_grads(u, element(grads_.data(), recipe.grads, at));
    }
    if (device_.holds_data())
      optimizer_->load_master(optim::ConstElementSpan(master.data(), master.size(), DType::kF32));
  }

  std::vector<float> full_weights(int unit) override {
    // Every rank's shard of fp32 weights, gathered whole; then this unit's range.
    std::vector<float> mine(shard_.shard);
    const optim::ElementSpan master = optimizer_->master();
    if (!master.empty()) {
      convert(master.data(), master.dtype(), mine.data(), DType::kF32, mine.size());
    } else {
      convert(element(params_.data(), params_.dtype(), shard_.offset), params_.dtype(), mine.data(), DType::kF32,
              mine.size());
    }
    std::vector<float> all(shard_.padded);
    world_.all_gather(mine.data(), all.data(), shard_.shard, DType::kF32, "report: gather weights");
    const auto begin = all.begin() + static_cast<std::ptrdiff_t>(flat_.offset[unit]);
    return std::vector<float>(begin, begin + static_cast<std::ptrdiff_t>(flat_.count[unit]));
  }

 protected:
  void before_backward(int unit) override {
    if (stage_ == 1) return;
    const DType dtype = options_.recipe.grads;
    Buffer& grads = unit_grads_[static_cast<size_t>(unit)];
    grads = model::allocate_parameter_space(device_, flat_.unit_charge[unit], flat_.count[unit], dtype,
                                            Category::kGradients, fmt::format("unit {} gradients", unit));
    model_.bind_grads(unit, grads.data());
  }

  void after_backward(int unit) override {
    if (stage_ == 1) return;
    const DType dtype = options_.recipe.grads;
    Buffer& grads = unit_grads_[static_cast<size_t>(unit)];
    const size_t begin = flat_.offset[unit];
    const size_t end = begin + flat_.count[unit];
    // Units finish in decreasing flat order, so the bucket holds one contiguous range [bucket_lo_, bucket_hi_),
    // filled from its end backwards.
    if (bucket_lo_ != bucket_hi_ && (end != bucket_lo_ || bucket_hi_ - begin > bucket_capacity_)) flush_bucket();
    if (bucket_lo_ == bucket_hi_) bucket_hi_ = end;
    bucket_lo_ = begin;
    convert(grads.data(), dtype, bucket_at(begin), dtype, end - begin);
    model_.bind_grads(unit, nullptr);
    grads.reset();
    if (unit == 0) flush_bucket();  // the root is the last unit of every backward
  }

  void finish_gradients() override {
    if (stage_ == 2) return;  // reduced during backward
    // Stage 1: reduce-scatter the whole padded gradient buffer in reduce buckets.
    const size_t bucket = options_.scaled(options_.zero.reduce_bucket_elements);
    for (size_t lo = 0, index = 0; lo < shard_.padded; lo += bucket, ++index) {
      const size_t hi = std::min(shard_.padded, lo + bucket);
      reduce_scatter_range(element(grads_.data(), grads_.dtype(), lo), lo, hi,
                           fmt::format("gradient reduce-scatter, bucket {}", index));
    }
  }

  double gradient_sum_of_squares() override {
    return sum_over_world(optim::grad_sum_of_squares(shard_grads()), "clip: gradient norm");
  }

  void update(double lr, float grad_scale) override {
    const optim::PrecisionRecipe& recipe = options_.recipe;
    optim::ElementSpan params = optim::ElementSpan::of(params_).subspan(shard_.offset, shard_.shard);
    optimizer_->step(options_.adamw, params, shard_grads(), shard_.offset, decay_, lr, grad_scale);
    count_offload(shard_.shard);
    zero(grads_.data(), grads_.dtype(), grads_.count());
    // Every rank's updated shard into every rank's parameters, in all-gather buckets.
    const size_t bucket = options_.scaled(options_.zero.allgather_bucket_elements);
    for (size_t lo = 0, index = 0; lo < shard_.padded; lo += bucket, ++index) {
      const size_t hi = std::min(shard_.padded, lo + bucket);
      const std::vector<size_t> counts = block_counts(lo, hi);
      size_t mine = 0, unused = 0;
      shard_blocks(lo, hi, mine, unused);
      const std::string phase = fmt::format("parameter all-gather, bucket {}", index);
      PhaseScope scope(device_.memory(), phase);
      void* recv = element(params_.data(), recipe.params, lo);
      world_.all_gather_v(element(params_.data(), recipe.params, mine), recv, counts, recipe.params, phase);
    }
  }

 private:
  // The gradients of this rank's shard: in place in the full buffer (stage 1) or the partition (stage 2).
  optim::ConstElementSpan shard_grads() const {
    const optim::ConstElementSpan all = optim::ConstElementSpan::of(grads_);
    return stage_ == 1 ? all.subspan(shard_.offset, shard_.shard) : all;
  }

  // How many elements of [lo, hi) each rank's shard holds: the reduce-scatter and all-gather blocks.
  std::vector<size_t> block_counts(size_t lo, size_t hi) const {
    std::vector<size_t> counts;
    for (int r = 0; r < world_.size(); ++r) {
      const ShardInfo other = shard_of(flat_.total, r, world_.size());
      const size_t begin = std::max(lo, other.offset);
      const size_t end = std::min(hi, other.offset + other.shard);
      counts.push_back(end > begin ? end - begin : 0);
    }
    return counts;
  }
  // This rank's block of [lo, hi), in flat coordinates (padding included).
  void shard_blocks(size_t lo, size_t hi, size_t& begin, size_t& end) const {
    begin = std::clamp(shard_.offset, lo, hi);
    end = std::clamp(shard_.offset + shard_.shard, lo, hi);
  }

  // Reduce-scatters (averages) flat range [lo, hi), held at `data`, in place: this rank's block ends up at its
  // own position in `data`.
  void reduce_scatter_range(void* data, size_t lo, size_t hi, const std::string& phase) {
    PhaseScope scope(device_.memory(), phase);
    const DType dtype = options_.recipe.grads;
    size_t begin = 0, end = 0;
    shard_blocks(lo, hi, begin, end);
    world_.reduce_scatter_v(data, element(data, dtype, begin - lo), block_counts(lo, hi), dtype, coll::ReduceOp::kAvg,
                            phase);
  }

  void* bucket_at(size_t flat_index) {
    Buffer& bucket = buckets_[current_bucket_];
    return element(bucket.data(), bucket.dtype(), bucket_capacity_ - (bucket_hi_ - flat_index));
  }

  // Stage 2: reduce-scatter the bucket's range to the owners; this rank adds its block to its partition.
  void flush_bucket() {
    if (bucket_lo_ == bucket_hi_) return;
    const DType dtype = options_.recipe.grads;
    void* data = bucket_at(bucket_lo_);
    reduce_scatter_range(data, bucket_lo_, bucket_hi_,
                         fmt::format("backward reduce-scatter, units from flat element {}", bucket_lo_));
    size_t begin = 0, end = 0;
    shard_blocks(bucket_lo_, bucket_hi_, begin, end);
    if (end > begin) {  // this rank's shard meets the bucket
      accumulate(element(data, dtype, begin - bucket_lo_), dtype, element(grads_.data(), dtype, begin - shard_.offset),
                 dtype, end - begin);
    }
    bucket_lo_ = bucket_hi_ = 0;
    current_bucket_ = (current_bucket_ + 1) % buckets_.size();
  }

  int stage_;
  FlatLayout flat_;
  ShardInfo shard_;
  Buffer params_;                   // [N·S] recipe.params, every unit whole
  Buffer grads_;                    // stage 1: [N·S]; stage 2: [S], this rank's partition
  std::vector<Buffer> buckets_;     // stage 2: [B] each
  std::vector<Buffer> unit_grads_;  // stage 2: [n_u] while unit u's backward runs
  size_t bucket_capacity_ = 0;
  size_t bucket_lo_ = 0, bucket_hi_ = 0;  // flat range held by the current bucket
  size_t current_bucket_ = 0;
  std::vector<optim::DecayRange> decay_;
  std::unique_ptr<optim::AdamWState> optimizer_;
};

}  // namespace

std::unique_ptr<Strategy> make_zero12(StrategyContext context, const StrategyOptions& options, int stage) {
  return std::make_unique<PartitionedOptimizer>(context, options, stage);
}

}  // namespace emu::strategy
