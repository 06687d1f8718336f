// FSDP2's predicted memory and traffic (fsdp2.cpp runs it), from the units' tensor shapes and the options alone.
//
// Every tensor is sharded on dim 0 (dim0_shard.h): unit u keeps S_u = Σ_p ceil(rows_p / N)·row_p elements per rank,
// its all-gather output, unsharded parameters and reduce-scatter input hold N·S_u. With p the param dtype (bf16 in
// the mixed recipe), r the reduce dtype (fp32 in mixed; the sharded parameters' dtype), g the gradient dtype, per
// rank:
//   parameters  Σ_u S_u·r (the sharded parameters; in host memory under offload) plus the unsharded units at the
//               peak: the root (never resharded after forward) and the largest block (reshard_after_forward=True)
//               or every block (False), each N·S_u·p
//   gradients   the sharded gradients (Σ_u S_u·r, made by the reduce-scatters; in host memory under offload) and the
//               unsharded ones autograd makes (n_u·g; the root's head and final norm part through the whole
//               backward beside the block's, its embeddings' part at the end)
//   buckets     the all-gather outputs (two at once in forward: the one kept for overlap and the next), the
//               prefetched block's beside the last reduce-scatter input (N·S_u·r)
//   optimizer   Adam's m and v over Σ_u S_u, no master copy (the fp32 sharded parameter is the optimizer's), and
//               torch.optim.AdamW's step temporaries over the local chunks of every tensor
// The peaks come from a walk over the step's events in the order the strategy makes them, each category on its
// own, rather than closed forms: which buffers overlap depends on the prefetch, the kept all-gather output and
// the first reduce-scatter of the step.
// Traffic per micro-batch: the root all-gathered once, each block twice (once without resharding after forward),
// every unit reduce-scattered once; once per step the gradient norm all-reduced. Under offload each all-gather
// first copies the shard up (S_u·r) and each reduce-scatter output goes down (S_u·r).
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "strategies/analytic.h"

namespace emu::strategy {
namespace {

// Live bytes of one category and their peak.
struct Live {
  uint64_t now = 0;
  uint64_t peak = 0;
  void add(uint64_t bytes) {
    now += bytes;
    peak = std::max(peak, now);
  }
  void sub(uint64_t bytes) { now -= bytes; }
};

struct Unit {
  Dim0Shards shards;
  uint64_t real = 0;  // n_u
  bool unsharded = false;
  bool gathering = false;     // all-gather output allocated, not yet copied out
  bool post_forward = false;  // reshard_after_forward=M: 1/M of the unit kept from forward to backward
  bool has_sharded_grad = false;
};

class Walk {
 public:
  Walk(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction)
      : options_(options), input_(input), prediction_(prediction) {
    const int n = input.world;
    for (size_t u = 0; u < input.unit_counts.size(); ++u) {
      Unit unit;
      if (u < input.unit_rows.size()) {
        unit.shards = dim0_shards(input.unit_rows[u], n);
      } else {
        const uint64_t count = input.unit_counts[u];
        const TensorRows whole{count, count, 0, input.elements(static_cast<int>(u), count), count};
        unit.shards = dim0_shards({&whole, 1}, n);
      }
      unit.real = input.unit_counts[u];
      units_.push_back(unit);
    }
    params_ = options.recipe.params;
    grads_ = options.recipe.grads;
    reduce_ = options.recipe.has_master ? DType::kF32 : options.recipe.params;
  }

  const std::vector<Unit>& units() const { return units_; }
  DType reduce_dtype() const { return reduce_; }

  void micro_batch() {
    const int last = static_cast<int>(units_.size()) - 1;
    for (int u = 0; u <= last; ++u) {
      unshard(u);
      wait(u, /*forward=*/true);
      if (u >= 1 && options_.fsdp2.post_forward_ranks > 0) {
        unsharded_.add(post_forward_bytes(u));
        units_[static_cast<size_t>(u)].post_forward = true;
        reshard(u);
      } else if (u >= 1 && options_.fsdp2.reshard_after_forward) {
        reshard(u);
      }
    }
    drop(kept_);  // the root's post-forward
    for (int u : backward_order()) {
      unshard(u);
      wait(u, /*forward=*/false);
      const int next = u == 0 ? last : u - 1;
      if (next >= 1) unshard(next);
      if (u == 0) {  // the root's backward encloses the blocks': its head's gradients now, the embeddings' last
        gradients_.add(input_.bytes(0, units_[0].real, grads_) - root_embedding_bytes());
        continue;
      }
      gradients_.add(input_.bytes(u, units_[static_cast<size_t>(u)].real, grads_));
      end_backward(u);
    }
    gradients_.add(root_embedding_bytes());
    end_backward(0);
    drop(reduce_scatter_);  // the end of backward releases the last reduce-scatter input
  }

  void finish() {
    const bool offload = input_.offload;
    uint64_t sharded = 0;
    for (const Unit& unit : units_) sharded += unit.shards.charged_shard();
    CategoryBytes& device = prediction_.peak;
    CategoryBytes& host = prediction_.host_peak;
    (offload ? host : device)[Category::kParameters] += sharded * dtype_size(reduce_);
    device[Category::kParameters] += unsharded_.peak;
    device[Category::kGradients] = gradients_.peak;
    if (offload) host[Category::kGradients] = host_gradients_.peak;
    device[Category::kBuckets] = buckets_.peak;
    (offload ? host : device)[Category::kOptimizerState] += 2 * sharded * dtype_size(options_.recipe.moments);
  }

 private:
  std::vector<int> backward_order() const {
    std::vector<int> order = {0};
    for (int u = static_cast<int>(units_.size()) - 1; u >= 1; --u) order.push_back(u);
    return order;
  }
  uint64_t root_embedding_bytes() const { return input_.root_embedding_elements() * dtype_size(grads_); }
  uint64_t shard_bytes(int u, DType dtype) const {
    return units_[static_cast<size_t>(u)].shards.charged_shard() * dtype_size(dtype);
  }
  uint64_t padded_bytes(int u, DType dtype) const {
    return units_[static_cast<size_t>(u)].shards.charged_padded() * dtype_size(dtype);
  }
  uint64_t post_forward_bytes(int u) const {
    return units_[static_cast<size_t>(u)].shards.charged_padded() /
           static_cast<uint64_t>(options_.fsdp2.post_forward_ranks) * dtype_size(params_);
  }
  void drop(uint64_t& bytes) {
    buckets_.sub(bytes);
    bytes = 0;
  }

  void unshard(int u) {
    Unit& unit = units_[static_cast<size_t>(u)];
    if (unit.unsharded || unit.gathering) return;
    if (input_.offload &&
        !unit.post_forward) {  // the shard copied up for the cast, freed once cast into the all-gather input
      buckets_.add(shard_bytes(u, reduce_));
      prediction_.pcie.host_to_device += shard_bytes(u, reduce_);
    }
    buckets_.add(padded_bytes(u, params_));
    if (input_.offload && !unit.post_forward) buckets_.sub(shard_bytes(u, reduce_));
    unit.gathering = true;
  }

  void wait(int u, bool forward) {
    Unit& unit = units_[static_cast<size_t>(u)];
    if (unit.unsharded) return;
    if (forward) drop(kept_);
    unsharded_.add(padded_bytes(u, params_));
    if (unit.post_forward) unsharded_.sub(post_forward_bytes(u));
    unit.post_forward = false;
    unit.unsharded = true;
    unit.gathering = false;
    if (forward && input_.world > 1) {
      kept_ = padded_bytes(u, params_);
    } else {
      buckets_.sub(padded_bytes(u, params_));
    }
  }

  void reshard(int u) {
    units_[static_cast<size_t>(u)].unsharded = false;
    unsharded_.sub(padded_bytes(u, params_));
  }

  void end_backward(int u) {
    Unit& unit = units_[static_cast<size_t>(u)];
    reshard(u);
    drop(reduce_scatter_);
    reduce_scatter_ = padded_bytes(u, reduce_);
    buckets_.add(reduce_scatter_);
    gradients_.sub(input_.bytes(u, unit.real, grads_));
    const uint64_t output = shard_bytes(u, reduce_);
    gradients_.add(output);
    if (input_.offload) {
      prediction_.pcie.device_to_host += output;
      if (!unit.has_sharded_grad) host_gradients_.add(output);
      gradients_.sub(output);
    } else if (unit.has_sharded_grad) {
      gradients_.sub(output);  // added into this step's sharded gradient
    }
    unit.has_sharded_grad = true;
  }

  const StrategyOptions& options_;
  const AnalyticInput& input_;
  Prediction& prediction_;
  std::vector<Unit> units_;
  DType params_ = DType::kBF16, grads_ = DType::kBF16, reduce_ = DType::kF32;
  Live unsharded_, gradients_, host_gradients_, buckets_;
  uint64_t kept_ = 0;            // the all-gather output kept in forward until the next copy-out
  uint64_t reduce_scatter_ = 0;  // the last reduce-scatter input, until the next
};

}  // namespace

Updated predict_fsdp2(const StrategyOptions& options, const AnalyticInput& given, Prediction& prediction) {
  // Over tensor-parallel layers (--tp T): the rank's TP slice (the input's units) sharded over the D = N/T replicas
  // of the "data-parallel" group, and tp's activation traffic in the "tensor-parallel" group.
  const Mesh mesh = mesh_of(options, given.world, given.rank);
  if (mesh.pipeline > 1) return predict_fsdp2_pipeline(options, given, prediction);
  AnalyticInput input = given;
  input.world = mesh.data;
  input.rank = mesh.data_rank();
  const std::string group = mesh.tensor > 1 ? "data-parallel" : "world";
  if (mesh.tensor > 1) {
    add_tensor_parallel_traffic(prediction, given, "tensor-parallel", mesh.tensor, true, options.recipe.grads);
  }
  Walk walk(options, input, prediction);
  for (int m = 0; m < input.accumulation; ++m) walk.micro_batch();
  walk.finish();
  prediction.formula =
      mesh.tensor > 1
          ? fmt::format(
                "(2 + 2 + K)Ψ/(t·D), t = {}, D = {}: the TP slice of every matrix sharded on dim 0 over the "
                "replicas",
                mesh.tensor, mesh.data)
          : fmt::format("(2 + 2 + K)Ψ/N: every parameter sharded on dim 0 over {} ranks", input.world);

  const uint64_t micro_batches = static_cast<uint64_t>(input.accumulation);
  const uint64_t param_bytes = dtype_size(options.recipe.params);
  const uint64_t reduce_bytes = dtype_size(walk.reduce_dtype());
  uint64_t all_tensors = 0, largest_tensor = 0;
  for (size_t u = 0; u < walk.units().size(); ++u) {
    const Dim0Shards& shards = walk.units()[u].shards;
    const int post_forward = options.fsdp2.post_forward_ranks;
    const uint64_t gathers = u != 0 && options.fsdp2.reshard_after_forward && post_forward == 0 ? 2 : 1;
    add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, group, shards.padded() * param_bytes, input.world,
                     micro_batches * gathers);
    if (u != 0 && post_forward > 0) {  // backward's all-gather within the post-forward group
      add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, "post-forward", shards.padded() * param_bytes,
                       post_forward, micro_batches);
    }
    add_ring_traffic(prediction, coll::CollectiveKind::kReduceScatter, group, shards.padded() * reduce_bytes,
                     input.world, micro_batches);
    for (const Dim0Tensor& t : shards.tensors) {
      all_tensors += t.charged_chunk();
      largest_tensor = std::max(largest_tensor, t.charged_chunk());
    }
  }
  add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "world", 4, given.world);  // the gradient norm
  switch (options.adamw_impl) {
    case optim::AdamWImpl::kForeach: prediction.step_temporary_elements = all_tensors; break;
    case optim::AdamWImpl::kSingle: prediction.step_temporary_elements = 2 * largest_tensor; break;
    case optim::AdamWImpl::kFused: break;
  }
  return {};  // the moments are set above: FSDP2 keeps no master copy
}

}  // namespace emu::strategy
