// ZeRO-3 (DeepSpeed) and FSDP (PyTorch): parameters, gradients and optimizer state all sharded, unit by unit.
//
// Each unit's flat buffer of n_u elements is padded to a multiple of the shard group's size M and cut into M
// shards of S_u elements (shard.h): FSDP's FlatParameter. Per rank and unit, persistently:
//   parameter shard  [S_u] recipe.params     kParameters
//   gradient shard   [S_u] kGradients        recipe.grads; fp32 for FSDP in the mixed recipe (FSDP keeps sharded
//                                            gradients at the fp32 parameter dtype after reducing in bf16)
//   master, m, v     [S_u]                   kMasterWeights / kOptimizerState: in the mixed recipe the master is
//                                            FSDP's fp32 sharded parameter, the bf16 shard its low-precision copy
// and while a unit is in use:
//   gathered         [M·S_u] recipe.params   kParameters: all-gathered before use, freed after
//   unit gradients   [M·S_u] recipe.grads    kGradients: made in backward, reduce-scattered (averaged), freed
//
// When parameters are gathered and released:
//   zero3, fsdp (FULL_SHARD)  gathered in forward and again in backward: all-gather ×2 + reduce-scatter per
//                             micro-batch. The root (embeddings, final norm, head) stays gathered from the start
//                             of forward to the end of backward, as FSDP's root unit does.
//   fsdp-grad-op              gathered once in forward and kept until the unit's backward ends
//   fsdp-no-shard             M = 1: every rank holds the whole unit; gradients all-reduced
//   fsdp-hybrid               M = ranks per node: FULL_SHARD inside a node; the reduce-scattered gradient shards
//                             are then all-reduced across nodes (same local rank)
// Prefetch: FSDP gathers the next unit early (backward_prefetch pre: before this unit's gradients are computed;
// post: after; forward_prefetch: the next block in forward). ZeRO-3 prefetches following units while they fit
// in the prefetch bucket and the live-parameter limit, and keeps units at or under the persistence threshold
// gathered once fetched. emu's collectives are blocking, so at most one prefetch is ahead of use at a time and
// FSDP's limit of two all-gathers in flight always holds; prefetch shows in memory, not in overlap.
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

struct UnitState {
  ShardInfo shard;
  Buffer params;    // [S_u] recipe.params: this rank's shard
  Buffer grads;     // [S_u] gradient shard
  Buffer gathered;  // [M·S_u] recipe.params while the unit is gathered
  Buffer unit_grads;  // [M·S_u] recipe.grads while the unit's backward runs
  std::unique_ptr<optim::AdamWState> optimizer;
  std::vector<optim::DecayRange> decay;  // unit coordinates
  bool persistent = false;  // ZeRO-3: stays gathered once fetched
};

class ShardedUnits final : public Strategy {
 public:
  using Strategy::Strategy;

  void setup() override {
    const optim::PrecisionRecipe& recipe = options_.recipe;
    const bool fsdp = options_.kind == StrategyKind::kFsdp;
    make_groups();
    grad_dtype_ = fsdp && recipe.has_master ? DType::kF32 : recipe.grads;
    const int units = model_.num_units();
    units_.resize(static_cast<size_t>(units));
    for (int u = 0; u < units; ++u) {
      UnitState& unit = units_[static_cast<size_t>(u)];
      const size_t count = model_.layout(u).count;
      unit.shard = shard_of(count, shard_rank(), shard_size());
      unit.params = device_.allocate(unit.shard.shard, recipe.params, Category::kParameters,
                                     fmt::format("unit {} parameter shard", u));
      unit.grads = device_.allocate(unit.shard.shard, grad_dtype_, Category::kGradients,
                                    fmt::format("unit {} gradient shard", u));
      unit.optimizer = std::make_unique<optim::AdamWState>(optimizer_device(), recipe, unit.shard.shard,
                                                           fmt::format("unit {} optimizer shard", u));
      unit.decay = decay_ranges(model_.layout(u), 0);
      unit.persistent = !fsdp && count <= options_.scaled(options_.zero.param_persistence_threshold);
      std::vector<float> initial(device_.holds_data() ? unit.shard.shard : 0);  // host scratch, padding stays 0
      init_into(model_, u, options_.seed, unit.shard.offset, unit.shard.valid,
                initial.empty() ? nullptr : initial.data(), DType::kF32);
      convert(initial.empty() ? nullptr : initial.data(), DType::kF32, unit.params.data(), recipe.params,
              initial.size());
      if (device_.holds_data()) unit.optimizer->load_master(optim::ConstElementSpan(initial.data(), initial.size(), DType::kF32));
    }
  }

  std::vector<float> full_weights(int u) override {
    UnitState& unit = units_[static_cast<size_t>(u)];
    std::vector<float> mine(unit.shard.shard);
    const optim::ElementSpan master = unit.optimizer->master();
    if (!master.empty()) {
      convert(master.data(), master.dtype(), mine.data(), DType::kF32, mine.size());
    } else {
      convert(unit.params.data(), unit.params.dtype(), mine.data(), DType::kF32, mine.size());
    }
    if (alone_) {
      mine.resize(unit.shard.numel);
      return mine;
    }
    std::vector<float> all(unit.shard.padded);
    shard_group().all_gather(mine.data(), all.data(), unit.shard.shard, DType::kF32, "report: gather weights");
    all.resize(unit.shard.numel);
    return all;
  }

  std::vector<coll::Communicator*> groups() override {
    std::vector<coll::Communicator*> all = {&world_};
    if (shard_group_ != nullptr) all.push_back(shard_group_);
    if (replicate_ != nullptr && replicate_ != &world_) all.push_back(replicate_);
    return all;
  }

 protected:
  void before_forward(int u) override {
    gather(u, "forward");
    if (u == 0) return;
    prefetch(u, /*forward=*/true);
  }

  void after_forward(int u) override {
    if (u == 0 || sharding() == Sharding::kShardGradOp) return;  // the root stays; SHARD_GRAD_OP keeps all
    release(u);
  }

  void before_backward(int u) override {
    gather(u, "backward");
    UnitState& unit = units_[static_cast<size_t>(u)];
    unit.unit_grads = device_.allocate(unit.shard.padded, options_.recipe.grads, Category::kGradients,
                                       fmt::format("unit {} gradients", u));
    model_.bind_grads(u, unit.unit_grads.data());
    if (backward_prefetch() == BackwardPrefetch::kPre || options_.kind == StrategyKind::kZero3) prefetch(u, false);
  }

  void after_backward(int u) override {
    // The root's backward ends the pass: nothing follows it to prefetch.
    if (backward_prefetch() == BackwardPrefetch::kPost && options_.kind == StrategyKind::kFsdp && u != 0) prefetch(u, false);
    reduce_gradients(u);
    release(u);
  }

  double gradient_sum_of_squares() override {
    // The ranks of one shard group own every element once; replicas across groups hold the same values.
    double local = 0;
    for (const UnitState& unit : units_) local += optim::grad_sum_of_squares(optim::ConstElementSpan::of(unit.grads));
    if (alone_) return local;
    float total = static_cast<float>(local);
    shard_group().all_reduce(&total, &total, 1, DType::kF32, coll::ReduceOp::kSum, "clip: gradient norm");
    return total;
  }

  void update(double lr, float grad_scale) override {
    for (UnitState& unit : units_) {
      unit.optimizer->step(options_.adamw, optim::ElementSpan::of(unit.params),
                           optim::ConstElementSpan::of(unit.grads), unit.shard.offset, unit.decay, lr, grad_scale);
    count_offload(unit.shard.shard);
      zero(unit.grads.data(), unit.grads.dtype(), unit.grads.count());
    }
    // Persistent units hold the old values: they are gathered afresh at the next use, as DeepSpeed re-gathers
    // persistent parameters after the optimizer step.
    for (int u = 0; u < model_.num_units(); ++u) release(u, /*stale=*/true);
  }

 private:
  Sharding sharding() const {
    return options_.kind == StrategyKind::kFsdp ? options_.fsdp.sharding : Sharding::kFullShard;
  }
  BackwardPrefetch backward_prefetch() const {
    return options_.kind == StrategyKind::kFsdp ? options_.fsdp.backward_prefetch : BackwardPrefetch::kNone;
  }
  coll::Communicator& shard_group() { return shard_group_ != nullptr ? *shard_group_ : world_; }
  int shard_rank() const { return alone_ ? 0 : (shard_group_ != nullptr ? shard_group_->rank() : world_.rank()); }
  int shard_size() const { return alone_ ? 1 : (shard_group_ != nullptr ? shard_group_->size() : world_.size()); }

  // The shard group (M ranks) and, when M < N, the replica group across shard groups. NO_SHARD is a shard group
  // of one rank and the world as replicas; HYBRID_SHARD takes the node-local and cross-node groups from the
  // context.
  void make_groups() {
    if (sharding() == Sharding::kNoShard) {
      alone_ = true;  // a shard group of one: nothing to gather or scatter
      replicate_ = &world_;
      return;
    }
    if (sharding() != Sharding::kHybridShard) return;
    if (context_.intra_node == nullptr || context_.inter_node == nullptr) {
      throw InputError("hybrid sharding needs the intra-node and inter-node groups (ranks per node)");
    }
    shard_group_ = context_.intra_node;
    replicate_ = context_.inter_node;
  }

  size_t live_elements() const {
    size_t live = 0;
    for (const UnitState& unit : units_) live += unit.gathered.count();
    return live;
  }

  void gather(int u, std::string_view pass) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    if (shard_size() == 1) {  // the shard is the whole unit; nothing to gather
      model_.bind_weights(u, unit.params.data());
      return;
    }
    if (unit.gathered.allocated()) return;
    const DType dtype = options_.recipe.params;
    const std::string phase = fmt::format("{} all-gather, unit {}", pass, u);
    PhaseScope scope(device_.memory(), phase);
    unit.gathered = device_.allocate(unit.shard.padded, dtype, Category::kParameters,
                                     fmt::format("unit {} gathered parameters", u));
    void* mine = element(unit.gathered.data(), dtype, unit.shard.offset);
    convert(unit.params.data(), dtype, mine, dtype, unit.shard.shard);
    shard_group().all_gather(mine, unit.gathered.data(), unit.shard.shard, dtype, phase);
    model_.bind_weights(u, unit.gathered.data());
  }

  // Frees unit u's gathered parameters, except a persistent unit's unless `stale` (its shard was just updated).
  void release(int u, bool stale = false) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    if (unit.persistent && !stale) return;
    model_.bind_weights(u, nullptr);
    unit.gathered.reset();
  }

  // Gathers the units that follow `u` in this pass's order ahead of use. Forward: u+1, ...; backward: L, ..., 1
  // (the root is gathered throughout).
  void prefetch(int u, bool forward) {
    const int last = model_.num_units() - 1;
    std::vector<int> next;
    if (forward) {
      for (int v = u + 1; v <= last; ++v) next.push_back(v);
    } else {
      for (int v = (u == 0 ? last : u - 1); v >= 1; --v) next.push_back(v);
    }
    if (options_.kind == StrategyKind::kFsdp) {
      if (!next.empty() && (!forward || options_.fsdp.forward_prefetch)) gather(next.front(), forward ? "forward prefetch" : "backward prefetch");
      return;
    }
    // ZeRO-3: following units while they fit in the prefetch bucket and under the live-parameter limit.
    const size_t budget = options_.scaled(options_.zero.prefetch_bucket_elements);
    const size_t max_live = options_.scaled(options_.zero.max_live_parameters);
    size_t fetched = 0;
    for (int v : next) {
      const size_t count = units_[static_cast<size_t>(v)].shard.padded;
      if (units_[static_cast<size_t>(v)].gathered.allocated()) continue;
      if (fetched + count > budget || live_elements() + count > max_live) break;
      gather(v, forward ? "forward prefetch" : "backward prefetch");
      fetched += count;
    }
  }

  // Reduce-scatters (averages) unit u's gradients over the shard group in place, all-reduces the shard across
  // replicas, and adds it to the gradient shard.
  void reduce_gradients(int u) {
    UnitState& unit = units_[static_cast<size_t>(u)];
    const DType dtype = options_.recipe.grads;
    void* data = unit.unit_grads.data();
    void* mine = element(data, dtype, unit.shard.offset);
    if (!alone_) {
      const std::string phase = fmt::format("backward reduce-scatter, unit {}", u);
      PhaseScope scope(device_.memory(), phase);
      shard_group().reduce_scatter(data, mine, unit.shard.shard, dtype, coll::ReduceOp::kAvg, phase);
    }
    if (replicate_) {
      const std::string phase = fmt::format("backward all-reduce across replicas, unit {}", u);
      PhaseScope scope(device_.memory(), phase);
      replicate_->all_reduce(mine, mine, unit.shard.shard, dtype, coll::ReduceOp::kAvg, phase);
    }
    accumulate(mine, dtype, unit.grads.data(), unit.grads.dtype(), unit.shard.shard);
    model_.bind_grads(u, nullptr);
    unit.unit_grads.reset();
  }

  std::vector<UnitState> units_;
  DType grad_dtype_ = DType::kBF16;
  bool alone_ = false;                         // NO_SHARD: the shard group is this rank alone
  coll::Communicator* shard_group_ = nullptr;  // HYBRID_SHARD: the node-local group
  coll::Communicator* replicate_ = nullptr;          // HYBRID_SHARD: the same local rank across nodes
};

}  // namespace

std::unique_ptr<Strategy> make_sharded(StrategyContext context, const StrategyOptions& options) {
  return std::make_unique<ShardedUnits>(context, options);
}

}  // namespace emu::strategy
