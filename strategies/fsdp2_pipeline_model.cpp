// FSDP2 over a pipeline's stages (fsdp2 --pp P, with or without --tp T: torchtitan's PP × FSDP2 and 3-D), predicted
// for the stage of `input.rank` from the units' tensor shapes and the options alone (fsdp2.cpp runs it).
//
// The stage holds the blocks pp gives it (predicted_stage_chunks) and, on the first stage, the root's embeddings
// (input.root_at_end), on the last its final norm and head; each of those units (of the rank's TP slice under --tp)
// sharded on dim 0 over the stage's D = N/(T·P) replicas (dim0_shard.h): S_u per rank, N·S_u gathered. With p the
// param dtype (bf16 in the mixed recipe), r the reduce dtype (fp32 in mixed; the sharded parameters' dtype), g the
// gradient dtype (bf16 in mixed), n_u a unit's charged elements, per rank:
//   parameters  Σ_u S_u·r sharded, plus every unit of the stage unsharded, Σ_u D·S_u·p: torchtitan's
//               reshard_after_forward=False under PP and the stage's backwards without resharding
//               (set_reshard_after_backward(False)) keep them from the first forward to the end of the step
//   gradients   each micro-batch's unsharded ones (n_u·g, a block's during its backward; the root's head part from
//               the start of the last stage's backward, its embeddings' at the end of the first stage's), upcast
//               into an accumulator at the first micro-batch (n_u·r per unit, held until the stage's last backward:
//               FSDPParam.unsharded_accumulated_grad; at g = r the .grad itself); then one reduce-scatter per unit
//               whose output S_u·r is the sharded gradient
//   buckets     the first forward's all-gather outputs (the one kept for overlap beside the next), and one
//               reduce-scatter input D·S_u·r at a time at the end
//   optimizer   Adam's m and v over Σ_u S_u and torch.optim.AdamW's step temporaries, as fsdp2
// Traffic per step: one all-gather of D·S_u·p and one reduce-scatter of D·S_u·r per unit in the "data-parallel"
// group, whatever M (the micro-batches); M·([not last] + [not first]) sends of b·s·h at the compute dtype in the
// "pipeline" group (b·s·h/T under --sequence-parallel); under --tp the stage's TP all-reduces (add_stage_tensor_
// traffic; with --sequence-parallel its reduce-scatters and all-gathers, and each of the stage's norm weights'
// gradients all-reduced once per step at r); the loss summed over the pipeline and the gradient norm over the world,
// 4 bytes each.
#include <fmt/format.h>

#include <algorithm>
#include <span>
#include <vector>

#include "strategies/analytic.h"

namespace emu::strategy {
namespace {

struct Held {
  Dim0Shards shards;
  uint64_t charged = 0;  // n_u as charged
  uint64_t early = 0;    // of it, made when the unit's backward begins (the root's head part on the last stage)
  bool accumulating = false;
};

struct Peak {
  uint64_t now = 0, peak = 0;
  void add(uint64_t bytes) {
    now += bytes;
    peak = std::max(peak, now);
  }
  void sub(uint64_t bytes) { now -= bytes; }
};

uint64_t charged_of(std::span<const TensorRows> rows) {
  uint64_t sum = 0;
  for (const TensorRows& t : rows) sum += t.charged;
  return sum;
}

// The stage's units in FSDP's order: the stage module's root (its root tensors: the embeddings on the first stage,
// the final norm and head on the last) first, then its blocks.
std::vector<Held> stage_units(const AnalyticInput& input, const StageBlocks& blocks, int stage, int stages, int d) {
  std::vector<Held> units;
  if (stage == 0 || stage == stages - 1) {
    std::vector<TensorRows> rows;
    uint64_t head = 0;
    for (size_t i = 0; i < input.unit_rows[0].size(); ++i) {
      const bool embedding = i < input.root_at_end.size() && input.root_at_end[i];
      if ((stage == 0 && embedding) || (stage == stages - 1 && !embedding)) rows.push_back(input.unit_rows[0][i]);
      if (stage == stages - 1 && !embedding) head += input.unit_rows[0][i].charged;
    }
    units.push_back({dim0_shards(rows, d), charged_of(rows), head});
  }
  for (int u = blocks.first; u <= blocks.last; ++u) {
    const std::vector<TensorRows>& rows = input.unit_rows[static_cast<size_t>(u)];
    units.push_back({dim0_shards(rows, d), charged_of(rows), 0});
  }
  return units;
}

// The gradients' peak over M backwards (the root's encloses the blocks') and the last backward's reduce-scatters,
// with g the gradient dtype and r the reduce dtype; `root`: units.front() is the stage's root.
uint64_t gradient_peak(std::vector<Held>& units, bool root, bool last_stage, int micro_batches, DType g, DType r) {
  Peak grads;
  // The bytes one backward makes of a unit: none once a reduce-dtype .grad accumulates in place.
  const auto made = [&](const Held& unit, uint64_t elements) {
    return g == r && unit.accumulating ? 0 : elements * dtype_size(g);
  };
  // The unit's backward ends: the first upcast into an accumulator, the made gradients freed once added into it.
  const auto end_backward = [&](Held& unit) {
    if (g != r && !unit.accumulating) grads.add(unit.charged * dtype_size(r));
    if (g != r) grads.sub(unit.charged * dtype_size(g));
    unit.accumulating = true;
  };
  for (int m = 0; m < micro_batches; ++m) {
    if (root && last_stage) grads.add(made(units.front(), units.front().early));
    for (size_t i = units.size(); i-- > (root ? 1 : 0);) {
      grads.add(made(units[i], units[i].charged));
      end_backward(units[i]);
    }
    if (root) {
      grads.add(made(units.front(), units.front().charged - units.front().early));  // the first stage's embeddings
      end_backward(units.front());
    }
  }
  for (const Held& unit : units) {  // each accumulator freed for its reduce-scatter output, the sharded gradient
    grads.sub(unit.charged * dtype_size(r));
    grads.add(unit.shards.charged_shard() * dtype_size(r));
  }
  return grads.peak;
}

// The buckets' peak: the first forward's all-gather outputs (the previous one kept until the next is copied out,
// with D > 1), then one reduce-scatter input at a time.
uint64_t bucket_peak(const std::vector<Held>& units, int d, DType p, DType r) {
  uint64_t buckets = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const uint64_t kept = i > 0 && d > 1 ? units[i - 1].shards.charged_padded() * dtype_size(p) : 0;
    buckets = std::max(buckets, units[i].shards.charged_padded() * dtype_size(p) + kept);
    buckets = std::max(buckets, units[i].shards.charged_padded() * dtype_size(r));
  }
  return buckets;
}

// Per step, one all-gather and one reduce-scatter per unit in the data-parallel group, the pipeline's sends and its
// loss, TP's all-reduces, the gradient norm; and AdamW's step temporaries.
void add_traffic(const StrategyOptions& options, const AnalyticInput& input, const Mesh& mesh, uint64_t own_blocks,
                 const std::vector<Held>& units, DType p, DType r, Prediction& prediction) {
  const int stage = mesh.pipeline_rank(), stages = mesh.pipeline;
  uint64_t all_tensors = 0, largest_tensor = 0;
  for (const Held& unit : units) {
    add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, "data-parallel",
                     unit.shards.padded() * dtype_size(p), mesh.data);
    add_ring_traffic(prediction, coll::CollectiveKind::kReduceScatter, "data-parallel",
                     unit.shards.padded() * dtype_size(r), mesh.data);
    for (const Dim0Tensor& t : unit.shards.tensors) {
      all_tensors += t.charged_chunk();
      largest_tensor = std::max(largest_tensor, t.charged_chunk());
    }
  }
  const auto micro_batches = static_cast<uint64_t>(input.accumulation);
  const uint64_t sends = micro_batches * ((stage < stages - 1 ? 1 : 0) + (stage > 0 ? 1 : 0));
  prediction.traffic.push_back(
      {coll::CollectiveKind::kSend, "pipeline", sends, sends * stage_boundary_bytes(input, mesh)});
  if (mesh.tensor > 1) add_stage_tensor_traffic(prediction, input, mesh, own_blocks, r);
  add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "pipeline", 4, stages);    // the loss (reporting)
  add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "world", 4, input.world);  // the gradient norm
  switch (options.adamw_impl) {
    case optim::AdamWImpl::kForeach: prediction.step_temporary_elements = all_tensors; break;
    case optim::AdamWImpl::kSingle: prediction.step_temporary_elements = 2 * largest_tensor; break;
    case optim::AdamWImpl::kFused: break;
  }
}

}  // namespace

Updated predict_fsdp2_pipeline(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction) {
  const Mesh mesh = mesh_of(options, input.world, input.rank);
  const int stage = mesh.pipeline_rank(), stages = mesh.pipeline, d = mesh.data;
  const StageBlocks blocks = predicted_stage_chunks(options, input, stages, stage).front();
  const DType p = options.recipe.params, g = options.recipe.grads;
  const DType r = options.recipe.has_master ? DType::kF32 : options.recipe.params;
  std::vector<Held> units = stage_units(input, blocks, stage, stages, d);
  const bool root = stage == 0 || stage == stages - 1;

  // Parameters: the shards, and every unit unsharded from the first forward to the step's end.
  uint64_t sharded = 0, unsharded = 0;
  for (const Held& unit : units) {
    sharded += unit.shards.charged_shard();
    unsharded += unit.shards.charged_padded() * dtype_size(p);
  }
  CategoryBytes& peak = prediction.peak;
  peak[Category::kParameters] += sharded * dtype_size(r) + unsharded;
  peak[Category::kGradients] = gradient_peak(units, root, stage == stages - 1, input.accumulation, g, r);
  peak[Category::kBuckets] = bucket_peak(units, d, p, r);
  peak[Category::kOptimizerState] += 2 * sharded * dtype_size(options.recipe.moments);
  const auto own_blocks = static_cast<uint64_t>(blocks.last) - static_cast<uint64_t>(blocks.first) + 1;
  add_traffic(options, input, mesh, own_blocks, units, p, r, prediction);
  prediction.formula = fmt::format(
      "(2 + 2 + K)Ψ_s/D + unsharded Ψ_s·(2 + 4): stage {} of {}, blocks {}..{}, sharded over D = {}{}", stage, stages,
      blocks.first, blocks.last, d, mesh.tensor > 1 ? fmt::format(", TP slices of t = {}", mesh.tensor) : "");
  return {};  // the moments are set above: FSDP2 keeps no master copy
}

}  // namespace emu::strategy
