// DDP as PyTorch runs it: a full replica on every rank; gradients all-reduced (averaged) bucket by bucket as
// backward completes them.
//
// Per rank, Ψ parameters, at the recipe's dtypes:
//   parameters  [Ψ]  kParameters      gradients  [Ψ]  kGradients
//   buckets     [Ψ]  kBuckets         unless gradient_as_bucket_view: DDP's bucket tensors hold a copy of every
//                                     gradient; with views the gradients live in the buckets and there is none
//   master, m, v [Ψ] kMasterWeights / kOptimizerState (optim/adamw_state.h)
// Buckets are assigned in reverse registration order (buckets.h); a bucket is reduced as soon as every unit it
// touches has finished backward, in bucket order, as DDP launches them. With gradient accumulation, only the last
// micro-batch reduces (no_sync on the others). The all-reduce is issued at the point in backward where DDP
// would launch it; emu's collectives are blocking, so its time is not overlapped with the remaining backward.
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "emu/check.h"
#include "strategies/buckets.h"
#include "strategies/flat.h"
#include "strategies/strategy.h"
#include "workloads/optim/adamw_state.h"

namespace emu::strategy {
namespace {

struct BucketRange {
  size_t begin = 0;  // flat elements [begin, end)
  size_t end = 0;
  int first_unit = 0;  // the lowest unit it touches: the last to finish backward
};

class Ddp final : public Strategy {
 public:
  using Strategy::Strategy;

  void setup() override {
    const optim::PrecisionRecipe& recipe = options_.recipe;
    flat_ = flat_layout(model_);
    params_ = model::allocate_parameter_space(device_, flat_.charge, flat_.total, recipe.params, Category::kParameters,
                                              "DDP parameters");
    grads_ = model::allocate_parameter_space(device_, flat_.charge, flat_.total, recipe.grads, Category::kGradients,
                                             "DDP gradients");
    plan_buckets();
    if (!options_.ddp.gradient_as_bucket_view) {
      buckets_buffer_ = model::allocate_parameter_space(device_, flat_.charge, flat_.total, recipe.grads,
                                                        Category::kBuckets, "DDP gradient buckets");
    }
    optimizer_ =
        std::make_unique<optim::AdamWState>(optimizer_device(), recipe, flat_.total, "DDP optimizer", flat_.charge);
    std::vector<float> initial(device_.holds_data() ? flat_.total : 0);  // host scratch for the initial values
    for (int u = 0; u < model_.num_units(); ++u) {
      const size_t at = flat_.offset[u];
      init_into(model_, u, options_.seed, 0, flat_.count[u], initial.empty() ? nullptr : initial.data() + at,
                DType::kF32);
      auto decay = decay_ranges(model_.layout(u), at);
      decay_.insert(decay_.end(), decay.begin(), decay.end());
    }
    convert(initial.empty() ? nullptr : initial.data(), DType::kF32, params_.data(), recipe.params, flat_.total);
    if (device_.holds_data())
      optimizer_->load_master(optim::ConstElementSpan(initial.data(), initial.size(), DType::kF32));
    for (int u = 0; u < model_.num_units(); ++u) {
      model_.bind_weights(u, element(params_.data(), recipe.params, flat_.offset[u]));
      model_.bind_grads(u, element(grads_.data(), recipe.grads, flat_.offset[u]));
    }
  }

  std::vector<float> full_weights(int unit) override {
    std::vector<float> out(flat_.count[unit]);
    const optim::ElementSpan master = optimizer_->master();
    if (!master.empty()) {
      convert(element(master.data(), master.dtype(), flat_.offset[unit]), master.dtype(), out.data(), DType::kF32,
              out.size());
    } else {
      convert(element(params_.data(), params_.dtype(), flat_.offset[unit]), params_.dtype(), out.data(), DType::kF32,
              out.size());
    }
    return out;
  }

 protected:
  void begin_micro_batch(int index, int count) override {
    sync_ = index == count - 1;
    next_bucket_ = 0;
  }

  void after_backward(int unit) override {
    if (!sync_) return;
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first_unit >= unit) {
      reduce_bucket(next_bucket_++);
    }
  }

  void finish_gradients() override {
    EMU_CHECK(next_bucket_ == buckets_.size(), "{} of {} DDP buckets were reduced in backward", next_bucket_,
              buckets_.size());
  }

  double gradient_sum_of_squares() override {
    // Every rank holds the same averaged gradients: the local sum is the global one.
    return optim::grad_sum_of_squares(optim::ConstElementSpan::of(grads_));
  }

  // Every parameter, as DDP's module registers them, each as a shrunk run charges it (model/shrink.h).
  std::vector<uint64_t> optimizer_tensors() const override {
    std::vector<uint64_t> tensors;
    for (const model::UnitLayout& unit : model_.layouts()) {
      for (const model::ParamInfo& p : unit.params) tensors.push_back(flat_.charge.elements(p.count));
    }
    return tensors;
  }

  void update(double lr, float grad_scale) override {
    optimizer_->step(options_.adamw, optim::ElementSpan::of(params_), optim::ConstElementSpan::of(grads_), 0, decay_,
                     lr, grad_scale);
    count_offload(flat_.charge.elements(flat_.total));
    zero(grads_.data(), grads_.dtype(), grads_.count());
  }

 private:
  // Buckets over the parameters in registration order (units in order, each unit's parameters in order); in
  // reverse order each bucket is a contiguous range of the flat buffer.
  void plan_buckets() {
    std::vector<size_t> bytes;
    std::vector<size_t> begin;
    std::vector<int> unit_of;
    for (int u = 0; u < model_.num_units(); ++u) {
      for (const model::ParamInfo& param : model_.layout(u).params) {
        bytes.push_back(param.count * dtype_size(options_.recipe.grads));
        begin.push_back(flat_.offset[u] + param.offset);
        unit_of.push_back(u);
      }
    }
    for (const Bucket& bucket : assign_buckets(bytes, options_.scaled(options_.ddp.first_bucket_bytes),
                                               options_.scaled(options_.ddp.bucket_bytes))) {
      const size_t last = bucket.params.back();  // reverse order: the lowest index comes last
      const size_t first = bucket.params.front();
      buckets_.push_back({begin[last], begin[first] + bytes[first] / dtype_size(options_.recipe.grads), unit_of[last]});
    }
  }

  void reduce_bucket(size_t index) {
    const BucketRange& bucket = buckets_[index];
    const std::string phase = fmt::format("backward all-reduce, bucket {}", index);
    PhaseScope scope(device_.memory(), phase);
    const DType dtype = grads_.dtype();
    const size_t count = bucket.end - bucket.begin;
    void* grads = element(grads_.data(), dtype, bucket.begin);
    if (options_.ddp.gradient_as_bucket_view) {
      world_.all_reduce(grads, grads, count, dtype, coll::ReduceOp::kAvg, phase);
      return;
    }
    void* copy = element(buckets_buffer_.data(), dtype, bucket.begin);
    convert(grads, dtype, copy, dtype, count);
    world_.all_reduce(copy, copy, count, dtype, coll::ReduceOp::kAvg, phase);
    convert(copy, dtype, grads, dtype, count);
  }

  FlatLayout flat_;
  Buffer params_;          // [Ψ] recipe.params
  Buffer grads_;           // [Ψ] recipe.grads
  Buffer buckets_buffer_;  // [Ψ] recipe.grads, unless gradient_as_bucket_view
  std::vector<BucketRange> buckets_;
  std::vector<optim::DecayRange> decay_;
  std::unique_ptr<optim::AdamWState> optimizer_;
  bool sync_ = true;
  size_t next_bucket_ = 0;
};

}  // namespace

std::unique_ptr<Strategy> make_ddp(StrategyContext context, const StrategyOptions& options) {
  return std::make_unique<Ddp>(context, options);
}

}  // namespace emu::strategy
