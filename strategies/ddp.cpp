// DDP as PyTorch runs it (torch.nn.parallel.DistributedDataParallel and its C++ Reducer): a full replica on every
// rank; gradients all-reduced (averaged) bucket by bucket as backward completes them. `ddp-zero` is the same DDP
// under PyTorch's ZeroRedundancyOptimizer (torch/distributed/optim/zero_redundancy_optimizer.py).
//
// Per rank, Ψ parameters, at the dtypes the framework keeps (with_framework_recipe: the mixed recipe is
// torch.autocast(bfloat16) over the fp32 model, so parameters and gradients are fp32 and there is no master copy):
//   parameters  [Ψ]  kParameters, from set-up
//   buckets     [Ψ]  kBuckets, from set-up: the Reducer's bucket tensors hold a copy of every gradient
//   gradients   [n_u] per unit, kGradients: each parameter's .grad comes into existence when backward reaches
//                    the op that reads it (AccumulateGrad; a block's tensor by tensor, flat.h BlockGradients) and
//                    zero_grad(set_to_none=True), PyTorch's default, frees it after the step. The root's in two
//                    parts (flat.h RootGradientCharges): the LM head's and final norm's as the head's backward
//                    reaches them, after the loss's backward, the embeddings' when it ends. With
//                    gradient_as_bucket_view the gradients are views into the buckets instead: one [Ψ] buffer charged
//                    as gradients from set-up, never freed, and no bucket copies.
//   m, v         per tensor AdamW updates, kOptimizerState: every tensor under DDP, the rank's own whole tensors
//                    under ZeroRedundancyOptimizer (greedy by size, buckets.h zero_redundancy_owners)
//   autocast's bf16 weights  kActivations, tensor by tensor: each Linear's weight and bias (GPT-2's Conv1D
//                    bias, Qwen2's q/k/v biases) cast to bf16 when it first runs in forward and kept in autocast's
//                    cache of parameter casts until forward ends (the autocast region closes after the loss). A
//                    weight's cast is saved by its layer for backward and freed when that layer's backward has run
//                    (when its gradient is made, gradient_made); a bias's is saved by none and goes with the cache.
//                    With checkpointing the blocks save nothing, yet the cache keeps every block's casts to the end
//                    of forward; the recomputation casts the block again (checkpoint re-enters autocast) and its
//                    bias casts go when it stops, before the block's first gradient. The LM head's from forward to
//                    the head's backward. Norm weights stay fp32 (autocast runs norms in fp32) and so do embeddings.
// Buckets are assigned in reverse registration order (buckets.h; 25 MiB, the first 1 MiB, at the gradients'
// dtype); a bucket is reduced as soon as every unit it touches has finished backward, in bucket order, as DDP
// launches them. With gradient accumulation, only the last micro-batch reduces (no_sync on the others). The
// all-reduce is at the gradients' dtype (fp32 under autocast), or in bf16 with the bf16_compress_hook (a bf16
// temporary of the bucket). emu's collectives are blocking, so the all-reduce's time is not overlapped with the
// remaining backward. ZeroRedundancyOptimizer then broadcasts every updated tensor from its owner
// (_sync_params: rank by rank, tensor by tensor).
//
// `zero0` is DeepSpeed 0.19 without ZeRO (a config's zero_optimization.stage 0) as the Hugging Face Trainer runs it,
// handing DeepSpeed its torch AdamW: runtime/engine.py _do_optimizer_sanity_check gives bf16 with bf16 gradient
// accumulation DDP_BFLOAT16, and _configure_fp16_optimizer wraps a client optimizer that is not DeepSpeed's
// FusedAdam in FP16_UnfusedOptimizer (runtime/fp16/unfused_optimizer.py). Per rank, at the recipe DeepSpeed keeps
// (the module cast to bf16, no autocast):
//   parameters  [Ψ]  bf16, kParameters, from set-up
//   gradients   [n_u] bf16 per unit, kGradients: autograd's .grad, made as backward reaches each tensor (as under
//                    DDP above) and freed by the wrapper's zero_grad(set_to_none=True) after the step
//   master      per tensor fp32, kMasterWeights: the wrapper's fp32_groups, a clone of every tensor that the inner
//                    AdamW steps over; m, v per tensor as under DDP
//   fp32 gradients [Ψ] kGradients, at step() only: FP16_UnfusedOptimizer.step casts every bf16 .grad into the fp32
//                    copy's .grad before the inner AdamW steps, and drops them all after it
//   all-reduce bucket  kBuckets, after backward only: no Reducer and no hooks; once the last micro-batch's backward
//                    is done, engine.py allreduce_gradients flattens the .grads in registration order into buckets
//                    of just over 500,000,000 elements ÷ k² (buckets.h deepspeed_allreduce_buckets), one at a
//                    time: a flat copy at the gradients' dtype, all-reduced (averaged) in it, copied back, freed.
// The all-reduce is at the gradients' dtype (communication_data_type defaults to bf16 under bf16). The fp32 recipe
// has no wrapper: torch AdamW steps the fp32 parameters, and the buckets are fp32. Clipping is the wrapper's, on
// the norm of the bf16 gradients, as emu's step clips.
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "emu/bf16.h"
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
  int first_unit = 0;    // the lowest unit it touches: the last to finish backward
  uint64_t charged = 0;  // zero0: its tensors' elements as a shrunk run charges them (model::tensor_charge)
};

// One parameter tensor, as the optimizer sees it.
struct Tensor {
  int unit = 0;
  size_t offset = 0;  // within the unit
  size_t flat = 0;    // within the flat space
  size_t count = 0;
  uint64_t charged = 0;  // elements as a shrunk run charges this tensor (model::tensor_charge)
  int owner = 0;         // the rank whose optimizer updates it (every rank's own under DDP)
};

// Whether autocast runs `param` in bf16: the weights (and biases) of the linear layers; not norms or embeddings.
bool autocast_casts(const model::ParamInfo& param) {
  const std::string& n = param.name;
  if (n.find("layernorm") != std::string::npos || n.find(".ln_") != std::string::npos) return false;
  return n.find("embed_tokens") == std::string::npos && n.find(".wte.") == std::string::npos &&
         n.find(".wpe.") == std::string::npos && n.find(".norm.") == std::string::npos;
}

class Ddp final : public Strategy {
 public:
  using Strategy::Strategy;

  void setup() override {
    const optim::PrecisionRecipe& recipe = options_.recipe;
    flat_ = flat_layout(model_);
    deepspeed_ = options_.kind == StrategyKind::kZero0;
    autocast_ = model_.compute_dtype() != recipe.params;
    bucket_view_ = options_.ddp.gradient_as_bucket_view && !deepspeed_;
    params_ = model::allocate_parameter_space(device_, flat_.charge, flat_.total, recipe.params, Category::kParameters,
                                              "DDP parameters");
    plan_tensors();
    plan_buckets();
    if (bucket_view_) {
      flat_grads_ = model::allocate_parameter_space(device_, flat_.charge, flat_.total, recipe.grads,
                                                    Category::kGradients, "DDP gradients (views into its buckets)");
    } else if (!deepspeed_) {
      buckets_buffer_ = model::allocate_parameter_space(device_, flat_.charge, flat_.total, recipe.grads,
                                                        Category::kBuckets, "DDP gradient buckets");
    }
    unit_grads_.resize(flat_.count.size());
    block_grads_.resize(flat_.count.size());
    casts_.resize(flat_.count.size());
    cast_charges_.resize(flat_.count.size());
    std::vector<float> initial(device_.holds_data() ? flat_.total : 0);  // host scratch for the initial values
    for (int u = 0; u < model_.num_units(); ++u) {
      const size_t at = flat_.offset[u];
      init_into(model_, u, options_.seed, 0, flat_.count[u], initial.empty() ? nullptr : initial.data() + at,
                DType::kF32);
      auto decay = decay_ranges(model_.layout(u), at);
      decay_.insert(decay_.end(), decay.begin(), decay.end());
    }
    convert(initial.empty() ? nullptr : initial.data(), DType::kF32, params_.data(), recipe.params, flat_.total);
    for (const Tensor& t : tensors_) {
      if (t.owner != world_.rank()) {
        optimizers_.emplace_back();
        continue;
      }
      auto state = std::make_unique<optim::AdamWState>(optimizer_device(), recipe, t.count, "DDP optimizer",
                                                       model::ParameterCharge{t.count, static_cast<double>(t.charged)});
      if (device_.holds_data()) {
        state->load_master(optim::ConstElementSpan(initial.data() + t.flat, t.count, DType::kF32));
      }
      optimizers_.push_back(std::move(state));
    }
    for (int u = 0; u < model_.num_units(); ++u) {
      // Under autocast each unit is bound to its bf16 cast in before_forward.
      if (!autocast_) model_.bind_weights(u, unit_params(u), recipe.params);
      if (bucket_view_) model_.bind_grads(u, element(flat_grads_.data(), recipe.grads, flat_.offset[u]), recipe.grads);
    }
  }

  std::vector<float> full_weights(int unit) override {
    std::vector<float> out(flat_.count[unit]);
    convert(unit_params(unit), params_.dtype(), out.data(), DType::kF32, out.size());
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const optim::ElementSpan master = optimizers_[i] ? optimizers_[i]->master() : optim::ElementSpan();
      if (tensors_[i].unit != unit || master.empty()) continue;
      convert(master.data(), master.dtype(), out.data() + tensors_[i].offset, DType::kF32, tensors_[i].count);
    }
    return out;
  }

 protected:
  void begin_micro_batch(int index, int count) override {
    sync_ = index == count - 1;
    next_bucket_ = 0;
  }

  void before_forward(int unit) override {
    if (autocast_) cast_unit(unit);
  }

  void after_forward(int unit) override {
    // The end of forward (the root's closing hook follows the loss): autocast's cache goes. What no layer saved goes
    // with it: every bias cast, and with checkpointing every block's weight casts too.
    if (!autocast_ || unit != 0) return;
    for (int u = 1; u < model_.num_units(); ++u) {
      if (model_.options().checkpoint) {
        release_casts(u);
      } else {
        release_bias_casts(u);
      }
    }
  }

  void before_backward(int unit) override {
    if (autocast_ && unit > 0) {
      if (unit == model_.num_units() - 1) release_casts(0);  // the head's backward, the root's last use, is done
      cast_unit(unit);                                       // kept from forward, or recomputed
    }
    if (bucket_view_) return;
    const std::string what = fmt::format("DDP gradients, {}", model_.layout(unit).name);
    if (unit == 0 && !unit_grads_[0].allocated()) {
      // The root's: tensor by tensor as autograd makes them (gradient_made, before_embedding_backward; flat.h).
      unit_grads_[0] = allocate_root_gradients(device_, model_, flat_.count[0], options_.recipe.grads, what);
      root_charges_.begin(device_, model_, options_.recipe.grads, what);
      model_.bind_grads(0, unit_grads_[0].data(), options_.recipe.grads);
    }
    if (unit > 0 && !block_grads_[unit].allocated()) {  // a block's, tensor by tensor (gradient_made)
      block_grads_[unit].allocate(device_, model_, unit, options_.recipe.grads, what);
      model_.bind_grads(unit, block_grads_[unit].data(), options_.recipe.grads);
    }
  }

  void gradient_made(int unit, size_t offset) override {
    if (unit == 0) {  // the head's cast goes at the first block's backward (before_backward)
      if (!bucket_view_) root_charges_.made(offset);
      return;
    }
    if (!bucket_view_) block_grads_[unit].made(offset);
    if (!autocast_) return;
    // The block's backward has begun, so a recomputation has stopped (its bias casts went with autocast's cache),
    // and the layer reading this parameter has run its backward, freeing its saved cast.
    release_bias_casts(unit);
    const std::vector<model::ParamInfo>& params = model_.layout(unit).params;
    for (size_t i = 0; i < params.size(); ++i) {
      if (i < cast_charges_[unit].size() && offset >= params[i].offset && offset < params[i].offset + params[i].count)
        cast_charges_[unit][i].reset();
    }
  }

  void before_embedding_backward() override {
    if (!bucket_view_) root_charges_.embeddings_made();
  }

  void after_backward(int unit) override {
    if (autocast_ && unit > 0) release_casts(unit);
    if (!bucket_view_ && unit > 0) block_grads_[unit].check_complete();
    if (!sync_ || deepspeed_) return;
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first_unit >= unit) {
      reduce_bucket(next_bucket_++);
    }
  }

  void finish_gradients() override {
    if (deepspeed_) {
      for (size_t b = 0; b < buckets_.size(); ++b) reduce_bucket(b);
      next_bucket_ = buckets_.size();
    }
    EMU_CHECK(next_bucket_ == buckets_.size(), "{} of {} DDP buckets were reduced in backward", next_bucket_,
              buckets_.size());
  }

  double gradient_sum_of_squares() override {
    // Every rank holds the same averaged gradients: the local sum is the global one.
    double sum = 0;
    for (int u = 0; u < model_.num_units(); ++u) {
      sum += optim::grad_sum_of_squares(optim::ConstElementSpan(unit_grads(u), flat_.count[u], options_.recipe.grads));
    }
    return sum;
  }

  // The tensors this rank's torch.optim.AdamW steps over, each as a shrunk run charges it (model/shrink.h).
  std::vector<uint64_t> optimizer_tensors() const override {
    std::vector<uint64_t> tensors;
    for (const Tensor& t : tensors_) {
      if (t.owner == world_.rank()) tensors.push_back(t.charged);
    }
    return tensors;
  }

  void update(double lr, float grad_scale) override {
    const optim::PrecisionRecipe& recipe = options_.recipe;
    // FP16_UnfusedOptimizer.step: every tensor's fp32 .grad, cast from its bf16 one, before the inner AdamW steps.
    const bool fp32_copies = deepspeed_ && recipe.grads != DType::kF32;
    Buffer fp32_grads;
    if (fp32_copies) {
      fp32_grads = model::allocate_parameter_space(device_, flat_.charge, flat_.total, DType::kF32,
                                                   Category::kGradients, "FP16_UnfusedOptimizer's fp32 gradients");
      for (int u = 0; u < model_.num_units(); ++u) {
        convert(unit_grads(u), recipe.grads, element(fp32_grads.data(), DType::kF32, flat_.offset[u]), DType::kF32,
                flat_.count[u]);
      }
    }
    uint64_t updated = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      if (!optimizers_[i]) continue;
      const optim::ConstElementSpan grads =
          fp32_copies
              ? optim::ConstElementSpan(element(fp32_grads.data(), DType::kF32, t.flat), t.count, DType::kF32)
              : optim::ConstElementSpan(element(unit_grads(t.unit), recipe.grads, t.offset), t.count, recipe.grads);
      optimizers_[i]->step(options_.adamw,
                           optim::ElementSpan(element(params_.data(), recipe.params, t.flat), t.count, recipe.params),
                           grads, t.flat, decay_, lr, grad_scale);
      updated += t.charged;
    }
    fp32_grads = Buffer();  // the wrapper drops the fp32 .grads after the inner step
    count_offload(updated);
    if (options_.kind == StrategyKind::kDdpZero) broadcast_updated();
    // zero_grad(set_to_none=True): the gradients are freed; views into the buckets are zeroed in place.
    if (bucket_view_) {
      zero(flat_grads_.data(), flat_grads_.dtype(), flat_grads_.count());
    } else {
      for (int u = 0; u < model_.num_units(); ++u) {
        unit_grads_[u] = Buffer();
        block_grads_[u].reset();
        model_.bind_grads(u, nullptr, recipe.grads);
      }
      root_charges_.reset();
    }
  }

 private:
  void* unit_params(int unit) { return element(params_.data(), params_.dtype(), flat_.offset[unit]); }
  void* unit_grads(int unit) {
    return bucket_view_ ? element(flat_grads_.data(), flat_grads_.dtype(), flat_.offset[unit])
                        : (unit == 0 ? unit_grads_[0].data() : block_grads_[unit].data());
  }

  // Every parameter tensor in registration order, with its owner under ZeroRedundancyOptimizer: partitioned by
  // the charged sizes, which are the full-scale sizes ÷ k², so that a shrunk run gives each rank the tensors the
  // full-scale one does (the held sizes of norm weights shrink by k only).
  void plan_tensors() {
    std::vector<uint64_t> counts;
    for (int u = 0; u < model_.num_units(); ++u) {
      for (const model::ParamInfo& p : model_.layout(u).params) {
        const uint64_t charged = model::tensor_charge(model_.config(), p);
        tensors_.push_back({u, p.offset, flat_.offset[u] + p.offset, p.count, charged, 0});
        counts.push_back(charged);
      }
    }
    const bool zero = options_.kind == StrategyKind::kDdpZero;
    const std::vector<int> owners = zero_redundancy_owners(counts, world_.size());
    for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i].owner = zero ? owners[i] : world_.rank();
  }

  // Buckets over the parameters in registration order (units in order, each unit's parameters in order); in
  // reverse order each bucket is a contiguous range of the flat buffer. DeepSpeed's are in registration order and
  // contiguous too.
  void plan_buckets() {
    if (deepspeed_) {  // filled by the charged sizes, so that a shrunk run closes them where the full-scale one does
      std::vector<uint64_t> charged;
      for (const Tensor& t : tensors_) charged.push_back(t.charged);
      for (const std::vector<size_t>& bucket :
           deepspeed_allreduce_buckets(charged, options_.scaled(kDeepSpeedAllreduceElements))) {
        const Tensor& first = tensors_[bucket.front()];
        const Tensor& last = tensors_[bucket.back()];
        uint64_t elements = 0;
        for (const size_t i : bucket) elements += charged[i];
        buckets_.push_back({first.flat, last.flat + last.count, first.unit, elements});
      }
      return;
    }
    const size_t grad_size = dtype_size(options_.recipe.grads);
    std::vector<size_t> bytes;
    for (const Tensor& t : tensors_) bytes.push_back(t.count * grad_size);
    for (const Bucket& bucket : assign_buckets(bytes, options_.scaled(options_.ddp.first_bucket_bytes),
                                               options_.scaled(options_.ddp.bucket_bytes))) {
      const Tensor& last = tensors_[bucket.params.back()];  // reverse order: the lowest index comes last
      const Tensor& first = tensors_[bucket.params.front()];
      buckets_.push_back({last.flat, first.flat + first.count, last.unit});
    }
  }

  // The unit's weights as autocast's ops read them, bound for its math: an fp32 copy charged nothing (host scratch)
  // in which each tensor autocast casts holds its bf16-rounded values, a block's linear weights and biases, the
  // root's LM head (the embedding, when tied), and every other tensor (norm weights, Gemma's (1 + w) included; the
  // embedding tables and GPT-2's wpe, untied) its fp32 value, as the norms and F.embedding, on none of autocast's
  // lists, read their fp32 parameters. A tied table is read rounded by its lookup too: one binding holds one value
  // per element. Each cast tensor is charged on its own (cast_charges_), so that it can go when PyTorch frees it.
  // The root's charge stands for the head's cast, which PyTorch makes when the head runs at the end of forward: emu
  // charges it from the start of forward, where it is held with fewer activations than at the loss.
  void cast_unit(int unit) {
    if (casts_[unit].count() > 0) return;
    const model::UnitLayout& layout = model_.layout(unit);
    const DType compute = model_.compute_dtype();
    casts_[unit] = device_.allocate(layout.count, DType::kF32, Category::kActivations,
                                    fmt::format("autocast's bf16 weights, {}", layout.name), 0);
    convert(unit_params(unit), params_.dtype(), casts_[unit].data(), DType::kF32, layout.count);
    auto* values = static_cast<float*>(casts_[unit].data());
    cast_charges_[unit].clear();
    cast_charges_[unit].resize(layout.params.size());
    for (size_t i = 0; i < layout.params.size(); ++i) {
      const model::ParamInfo& p = layout.params[i];
      if (!(unit == 0 ? is_head(p) : autocast_casts(p))) continue;
      cast_charges_[unit][i] =
          device_.allocate(0, compute, Category::kActivations, fmt::format("autocast's bf16 {}", p.name),
                           model::tensor_charge(model_.config(), p) * dtype_size(compute));
      if (values == nullptr) continue;
      for (size_t k = p.offset; k < p.offset + p.count; ++k) values[k] = round_to_bf16(values[k]);
    }
    model_.bind_weights(unit, values, DType::kF32);
  }

  void release_casts(int unit) {
    casts_[unit] = Buffer();
    cast_charges_[unit].clear();
  }

  // The unit's bias casts, which no layer saves: they live as long as autocast's cache.
  void release_bias_casts(int unit) {
    const std::vector<model::ParamInfo>& params = model_.layout(unit).params;
    for (size_t i = 0; i < cast_charges_[unit].size(); ++i) {
      if (params[i].name.ends_with(".bias")) cast_charges_[unit][i].reset();
    }
  }

  // The LM head's weight: lm_head, or the embedding it is tied to.
  bool is_head(const model::ParamInfo& p) const {
    if (p.name == "lm_head.weight") return true;
    return model_.config().tie_embeddings &&
           (p.name.find("embed_tokens") != std::string::npos || p.name.find(".wte.") != std::string::npos);
  }

  // Copies flat elements [begin, end) of the gradients from (to_bucket) or to the unit buffers.
  void copy_bucket(size_t begin, size_t end, void* bucket, bool to_bucket) {
    const DType dtype = options_.recipe.grads;
    for (int u = 0; u < model_.num_units(); ++u) {
      const size_t lo = std::max(begin, flat_.offset[u]);
      const size_t hi = std::min(end, flat_.offset[u] + flat_.count[u]);
      if (lo >= hi) continue;
      void* grads = element(unit_grads(u), dtype, lo - flat_.offset[u]);
      void* slot = element(bucket, dtype, lo - begin);
      if (to_bucket) {
        convert(grads, dtype, slot, dtype, hi - lo);
      } else {
        convert(slot, dtype, grads, dtype, hi - lo);
      }
    }
  }

  void reduce_bucket(size_t index) {
    const BucketRange& bucket = buckets_[index];
    // DeepSpeed's come after backward (not overlapped with it, as the step-time model reads from the phase's name).
    const std::string phase =
        fmt::format("{} all-reduce, bucket {}", deepspeed_ ? "after-backward" : "backward", index);
    PhaseScope scope(device_.memory(), phase);
    const DType dtype = options_.recipe.grads;
    const size_t count = bucket.end - bucket.begin;
    if (bucket_view_) {
      all_reduce(element(flat_grads_.data(), dtype, bucket.begin), count, phase);
      return;
    }
    if (deepspeed_) {  // engine.py allreduce_bucket: a flat copy of the bucket's .grads, freed once copied back
      const Buffer flat = device_.allocate(count, dtype, Category::kBuckets, "DeepSpeed's flattened all-reduce bucket",
                                           bucket.charged * dtype_size(dtype));
      copy_bucket(bucket.begin, bucket.end, flat.data(), true);
      all_reduce(flat.data(), count, phase);
      copy_bucket(bucket.begin, bucket.end, flat.data(), false);
      return;
    }
    void* copy = element(buckets_buffer_.data(), dtype, bucket.begin);
    copy_bucket(bucket.begin, bucket.end, copy, true);
    all_reduce(copy, count, phase);
    copy_bucket(bucket.begin, bucket.end, copy, false);
  }

  // The bucket's all-reduce (average) at the gradients' dtype, or through bf16_compress_hook.
  void all_reduce(void* data, size_t count, const std::string& phase) {
    const DType dtype = options_.recipe.grads;
    if (deepspeed_ || options_.ddp.comm_hook == CommHook::kNone || dtype == DType::kBF16) {
      world_.all_reduce(data, data, count, dtype, coll::ReduceOp::kAvg, phase);
      return;
    }
    Buffer compressed = model::allocate_parameter_space(device_, flat_.charge, count, DType::kBF16,
                                                        Category::kTemporaries, "bf16_compress_hook's bucket");
    convert(data, dtype, compressed.data(), DType::kBF16, count);
    world_.all_reduce(compressed.data(), compressed.data(), count, DType::kBF16, coll::ReduceOp::kAvg, phase);
    convert(compressed.data(), DType::kBF16, data, dtype, count);
  }

  // ZeroRedundancyOptimizer._sync_params: each rank in turn broadcasts the tensors it owns, in its partition's
  // order (largest first), so every replica holds the updated parameters.
  void broadcast_updated() {
    const std::string phase = "ZeroRedundancyOptimizer broadcast of updated parameters";
    PhaseScope scope(device_.memory(), phase);
    std::vector<size_t> order(tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return tensors_[a].count > tensors_[b].count; });
    // Owner by owner (ranks that own nothing broadcast nothing: a plan of 2^20 ranks does not visit them), each
    // owner's tensors in that order.
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return tensors_[a].owner < tensors_[b].owner; });
    const DType dtype = params_.dtype();
    for (size_t i : order) {
      const Tensor& t = tensors_[i];
      void* data = element(params_.data(), dtype, t.flat);
      world_.broadcast(data, data, t.count, dtype, t.owner, phase);
    }
  }

  FlatLayout flat_;
  bool deepspeed_ = false;          // zero0: DeepSpeed's engine and FP16_UnfusedOptimizer, not PyTorch DDP
  bool autocast_ = false;           // fp32 weights and gradients around bf16 math (the mixed recipe)
  bool bucket_view_ = false;        // gradient_as_bucket_view
  Buffer params_;                   // [Ψ] recipe.params
  Buffer flat_grads_;               // [Ψ] recipe.grads: with gradient_as_bucket_view, the gradients are the buckets
  Buffer buckets_buffer_;           // [Ψ] recipe.grads: the Reducer's bucket copies, without gradient_as_bucket_view
  std::vector<Buffer> unit_grads_;  // [units] the root's [n_0] recipe.grads, from its backward to zero_grad
  std::vector<BlockGradients> block_grads_;  // [units] the blocks' [n_u], made tensor by tensor, freed by zero_grad
  RootGradientCharges root_charges_;         // unit_grads_[0]'s charge, tensor by tensor as autograd makes them
  std::vector<Buffer> casts_;  // [units] [n_u] fp32: a unit's weights as autocast's ops read them (cast_unit)
  std::vector<std::vector<Buffer>> cast_charges_;  // [units][parameters] their charges, tensor by tensor
  std::vector<Tensor> tensors_;
  std::vector<BucketRange> buckets_;
  std::vector<optim::DecayRange> decay_;
  std::vector<std::unique_ptr<optim::AdamWState>> optimizers_;  // [tensors] null where another rank owns it
  bool sync_ = true;
  size_t next_bucket_ = 0;
};

}  // namespace

std::unique_ptr<Strategy> make_ddp(StrategyContext context, const StrategyOptions& options) {
  return std::make_unique<Ddp>(context, options);
}

}  // namespace emu::strategy
