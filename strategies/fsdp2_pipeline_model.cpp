// FSDP2 over a pipeline's stages (fsdp2 --pp P, with or without --tp T and --virtual-stages V: torchtitan's PP × FSDP2,
// its 3-D and its Interleaved1F1B), predicted for the stage of `input.rank` from the units' tensor shapes and the
// options alone (fsdp2.cpp runs it).
//
// The stage holds the blocks pp gives it (predicted_stage_chunks: one chunk, or V interleaved ones, each an FSDP
// module of its own) and, on the first chunk of the first stage, the root's embeddings (input.root_at_end), on the
// last chunk of the last stage its final norm and head; each of those units (of the rank's TP slice under --tp)
// sharded on dim 0 over the stage's D = N/(T·P) replicas (dim0_shard.h): S_u per rank, N·S_u gathered. With p the
// param dtype (bf16 in the mixed recipe), r the reduce dtype (fp32 in mixed; the sharded parameters' dtype), g the
// gradient dtype (bf16 in mixed), n_u a unit's charged elements, per rank:
//   parameters  Σ_u S_u·r sharded, plus every unit of every chunk unsharded, Σ_u D·S_u·p: torchtitan's
//               reshard_after_forward=False under PP and the backwards without resharding
//               (set_reshard_after_backward(False)) keep each chunk's from its first forward to its post-backward,
//               and every chunk's first forward comes in the warm-up, before any backward
//   gradients   each micro-batch's unsharded ones (n_u·g, a block's during its backward; the root's head part from
//               the start of the last chunk's backward, its embeddings' at the end of the first chunk's), upcast
//               into an accumulator at the first micro-batch (n_u·r per unit, held until its chunk's last backward:
//               FSDPParam.unsharded_accumulated_grad; at g = r the .grad itself); then one reduce-scatter per unit
//               whose output S_u·r is the sharded gradient. Interleaved, a chunk's post-backward follows its own last
//               backward, so the peak follows the schedule's order of backwards (pipeline.h stage_order)
//   buckets     each chunk's first forward's all-gather outputs (the one kept for overlap beside the next), and one
//               reduce-scatter input D·S_u·r at a time in a post-backward
//   optimizer   Adam's m and v over Σ_u S_u and torch.optim.AdamW's step temporaries, as fsdp2
// Traffic per step: one all-gather of D·S_u·p and one reduce-scatter of D·S_u·r per unit in the "data-parallel"
// group, whatever M (the micro-batches); M·(V − [last] + V − [first]) sends of b·s·h at the compute dtype in the
// "pipeline" group (each chunk's activations on and gradients back, none past the model's ends; b·s·h/T under
// --sequence-parallel); under --tp the stage's TP all-reduces (add_stage_tensor_traffic; with --sequence-parallel
// its reduce-scatters and all-gathers, and each of the stage's norm weights' gradients all-reduced once per step at
// r); the loss summed over the pipeline and the gradient norm over the world, 4 bytes each.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <span>
#include <vector>

#include "strategies/analytic.h"

namespace emu::strategy {
namespace {

struct Held {
  Dim0Shards shards;
  uint64_t charged = 0;  // n_u as charged
  uint64_t early = 0;    // of it, made by the head's backward, first (the root's head part on the last stage)
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

// One FSDP module of the stage: the whole stage, or with --virtual-stages one chunk of it. Its units in FSDP's order:
// the module's root (its root tensors: the embeddings on the first chunk of the first stage, the final norm and head
// on the last chunk of the last) first, when it has any, then its blocks.
struct Module {
  std::vector<Held> units;
  bool root = false;  // units.front() is the root
  bool head = false;  // the root holds the final norm and head (made by the head's backward, first)
};

Module chunk_module(const AnalyticInput& input, const StageBlocks& blocks, bool embeddings, bool head, int d) {
  Module module;
  if (embeddings || head) {
    std::vector<TensorRows> rows;
    uint64_t early = 0;
    for (size_t i = 0; i < input.unit_rows[0].size(); ++i) {
      const bool embedding = i < input.root_at_end.size() && input.root_at_end[i];
      if ((embeddings && embedding) || (head && !embedding)) rows.push_back(input.unit_rows[0][i]);
      if (head && !embedding) early += input.unit_rows[0][i].charged;
    }
    module.units.push_back({dim0_shards(rows, d), charged_of(rows), early});
    module.root = true;
    module.head = head;
  }
  for (int u = blocks.first; u <= blocks.last; ++u) {
    const std::vector<TensorRows>& rows = input.unit_rows[static_cast<size_t>(u)];
    module.units.push_back({dim0_shards(rows, d), charged_of(rows), 0});
  }
  return module;
}

// The gradients' peak over the stage's schedule (pipeline.h stage_order: only its backwards make gradients), with g
// the gradient dtype and r the reduce dtype. A module's backward: the root's head part when it begins (the last
// chunk of the last stage), its blocks in reverse, then the root's embeddings (the first chunk of the first stage).
// After a module's last backward of the step its post-backward: each unit's accumulated gradients freed for its
// reduce-scatter output, the sharded gradient.
uint64_t gradient_peak(std::vector<Module>& modules, std::span<const PipelineOp> order, int micro_batches, DType g,
                       DType r) {
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
  std::vector<int> backwards(modules.size(), 0);
  for (const PipelineOp& op : order) {
    if (op.forward) continue;
    Module& module = modules[static_cast<size_t>(op.chunk)];
    std::vector<Held>& units = module.units;
    if (module.head) grads.add(made(units.front(), units.front().early));
    for (size_t i = units.size(); i-- > (module.root ? 1 : 0);) {
      grads.add(made(units[i], units[i].charged));
      end_backward(units[i]);
    }
    if (module.root) {
      grads.add(made(units.front(), units.front().charged - units.front().early));  // the first stage's embeddings
      end_backward(units.front());
    }
    if (++backwards[static_cast<size_t>(op.chunk)] < micro_batches) continue;
    for (const Held& unit : units) {
      grads.sub(unit.charged * dtype_size(r));
      grads.add(unit.shards.charged_shard() * dtype_size(r));
    }
  }
  return grads.peak;
}

// The buckets' peak: each module's first forward's all-gather outputs (the previous one kept until the next is copied
// out, with D > 1, and the last freed by the module's root post-forward), then one reduce-scatter input at a time.
uint64_t bucket_peak(const std::vector<Module>& modules, int d, DType p, DType r) {
  uint64_t buckets = 0;
  for (const Module& module : modules) {
    const std::vector<Held>& units = module.units;
    for (size_t i = 0; i < units.size(); ++i) {
      const uint64_t kept = i > 0 && d > 1 ? units[i - 1].shards.charged_padded() * dtype_size(p) : 0;
      buckets = std::max(buckets, units[i].shards.charged_padded() * dtype_size(p) + kept);
      buckets = std::max(buckets, units[i].shards.charged_padded() * dtype_size(r));
    }
  }
  return buckets;
}

// Per step, one all-gather and one reduce-scatter per unit in the data-parallel group, the pipeline's sends and its
// loss, TP's all-reduces, the gradient norm; and AdamW's step temporaries.
void add_traffic(const StrategyOptions& options, const AnalyticInput& input, const Mesh& mesh, uint64_t own_blocks,
                 const std::vector<Module>& modules, DType p, DType r, Prediction& prediction) {
  const int stage = mesh.pipeline_rank(), stages = mesh.pipeline;
  uint64_t all_tensors = 0, largest_tensor = 0;
  for (const Module& module : modules) {
    for (const Held& unit : module.units) {
      add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, "data-parallel",
                       unit.shards.padded() * dtype_size(p), mesh.data);
      add_ring_traffic(prediction, coll::CollectiveKind::kReduceScatter, "data-parallel",
                       unit.shards.padded() * dtype_size(r), mesh.data);
      for (const Dim0Tensor& t : unit.shards.tensors) {
        all_tensors += t.charged_chunk();
        largest_tensor = std::max(largest_tensor, t.charged_chunk());
      }
    }
  }
  // Each chunk's M activations on and M gradients back, none past the model's ends.
  const auto micro_batches = static_cast<uint64_t>(input.accumulation);
  const auto v = static_cast<uint64_t>(modules.size());
  const uint64_t sends = micro_batches * ((stage < stages - 1 ? v : v - 1) + (stage > 0 ? v : v - 1));
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
  const std::vector<StageBlocks> chunks = predicted_stage_chunks(options, input, stages, stage);
  const int v = static_cast<int>(chunks.size());
  const DType p = options.recipe.params, g = options.recipe.grads;
  const DType r = options.recipe.has_master ? DType::kF32 : options.recipe.params;
  std::vector<Module> modules;
  uint64_t own_blocks = 0;
  std::vector<std::string> ranges;
  for (int c = 0; c < v; ++c) {
    const StageBlocks& blocks = chunks[static_cast<size_t>(c)];
    modules.push_back(chunk_module(input, blocks, stage == 0 && c == 0, stage == stages - 1 && c == v - 1, d));
    own_blocks += static_cast<uint64_t>(blocks.last) - static_cast<uint64_t>(blocks.first) + 1;
    ranges.push_back(fmt::format("{}..{}", blocks.first, blocks.last));
  }

  // Parameters: the shards, and every unit of every chunk unsharded from its chunk's first forward (all within the
  // warm-up) to its chunk's post-backward.
  uint64_t sharded = 0, unsharded = 0;
  for (const Module& module : modules) {
    for (const Held& unit : module.units) {
      sharded += unit.shards.charged_shard();
      unsharded += unit.shards.charged_padded() * dtype_size(p);
    }
  }
  CategoryBytes& peak = prediction.peak;
  peak[Category::kParameters] += sharded * dtype_size(r) + unsharded;
  const std::vector<PipelineOp> order =
      stage_order(options.pipeline.schedule, stages, stage, input.accumulation, options.pipeline.virtual_stages);
  peak[Category::kGradients] = gradient_peak(modules, order, input.accumulation, g, r);
  peak[Category::kBuckets] = bucket_peak(modules, d, p, r);
  peak[Category::kOptimizerState] += 2 * sharded * dtype_size(options.recipe.moments);
  add_traffic(options, input, mesh, own_blocks, modules, p, r, prediction);
  prediction.formula =
      fmt::format("(2 + 2 + K)Ψ_s/D + unsharded Ψ_s·(2 + 4): stage {} of {}, blocks {}{}, sharded over D = {}{}", stage,
                  stages, fmt::join(ranges, ", "), v > 1 ? fmt::format(" ({} chunks, each an FSDP module)", v) : "", d,
                  mesh.tensor > 1 ? fmt::format(", TP slices of t = {}", mesh.tensor) : "");
  return {};  // the moments are set above: FSDP2 keeps no master copy
}

}  // namespace emu::strategy
