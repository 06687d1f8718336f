// The analytic model of pipeline parallelism (pipeline.cpp), for the stage of `input.rank` among P = input.world:
//   blocks      the stage's blocks (pipeline.h, balance_stages over the blocks' parameters, the embeddings weighing
//               on the first stage and the final norm and head on the last)
//   Ψ_s         the parameters of its blocks, plus the embeddings on the first stage and the final norm, the head and
//               a tied embedding's copy on the last
//   memory      parameters 2Ψ_s, gradients 2Ψ_s, master weights 4Ψ_s, Adam m and v 8Ψ_s: 16Ψ_s in the mixed recipe
//               (the ZeRO paper's K = 12 over the stage's own parameters only)
//   traffic     per step, M micro-batches (input.accumulation): M sends of b·s·h elements to the next stage (all
//               but the last) and M to the previous one (all but the first), at the compute dtype; with tied
//               embeddings the first and the last stage all-reduce the table's gradient (2 ranks: once its size)
//   interleaved with V chunks per stage (--virtual-stages): the stage's blocks are its V chunks of L/(P·V)
//               (chunk v: layer group v·P + p), and each chunk sends its M activations on (the last stage's chunk
//               V − 1 none) and its M gradients back (the first stage's chunk 0 none): (2V − [first] − [last])·M sends
//   data        with D = N/P > 1 replicas (--pp P < N): the sends in the "pipeline" group, and per step one
//               all-reduce of each unit's gradients the stage owns in the "data-parallel" group, 2(D − 1)/D of them
//   optimizer   with the distributed optimizer the stage's optimizer state of 1/D of its elements, and a
//               reduce-scatter of its gradients and an all-gather of its parameters instead, (D − 1)/D each
//   tensor      with T > 1 (--tp with --pp) the stage's units are their TP slices (input.unit_counts are the
//               model's local ones), and per micro-batch the stage's TP group all-reduces b·s·h 4 times per block
//               (6 checkpointed), once more on the first stage (the embedding output) and on the last (the head's
//               input gradient), and 3 times b·s fp32 on the last (the parallel cross-entropy), ring 2(T − 1)/T
//   sequence    with --sequence-parallel each of those b·s·h all-reduces a reduce-scatter and an all-gather
//               ((T − 1)/T each), 2 all-gathers more per block and 1 more on the last stage (the saved inputs of
//               q/k/v, gate/up and the head gathered again in backward), and once per step one fp32 all-reduce of
//               the stage's norm weights' gradients (2 per block, the final norm on the last stage); the sends carry
//               each TP rank's b·s·h/T (Megatron's get_tensor_shapes divides the sequence by T)
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "strategies/analytic.h"
#include "strategies/pipeline.h"
#include "strategies/shard.h"

namespace emu::strategy {

uint64_t stage_boundary_bytes(const AnalyticInput& input, const Mesh& mesh) {
  return input.sequence_parallel ? input.boundary_bytes / static_cast<uint64_t>(mesh.tensor) : input.boundary_bytes;
}

std::vector<StageBlocks> predicted_stage_chunks(const StrategyOptions& options, const AnalyticInput& input, int stages,
                                                int stage) {
  std::vector<uint64_t> blocks;
  for (size_t u = 1; u < input.unit_counts.size(); ++u) {
    uint64_t charged = 0;
    if (input.unit_tensors_charged.empty()) {
      charged = input.unit_counts[u];
    } else {
      for (const uint64_t t : input.unit_tensors_charged[u]) charged += t;
    }
    blocks.push_back(charged);
  }
  const int chunks = options.pipeline.virtual_stages;
  std::vector<StageBlocks> mine;  // the stage's chunks
  if (chunks > 1) {
    mine = interleaved_chunks(static_cast<int>(blocks.size()), stages, chunks)[static_cast<size_t>(stage)];
  } else {
    mine.push_back(balance_stages(blocks, input.root_first_stage, input.root_last_stage, stages)[stage]);
  }
  return mine;
}

void add_stage_tensor_traffic(Prediction& prediction, const AnalyticInput& input, const Mesh& mesh, uint64_t own_blocks,
                              std::optional<DType> per_norm_dtype) {
  const int stage = mesh.pipeline_rank();
  const int stages = mesh.pipeline;
  const bool first = stage == 0, last = stage == stages - 1;
  const uint64_t micro_batches = static_cast<uint64_t>(input.accumulation);
  const uint64_t hidden = own_blocks * (input.checkpoint ? 6 : 4) + (first ? 1 : 0) + (last ? 1 : 0);
  if (input.sequence_parallel) {
    // Each all-reduce a reduce-scatter and an all-gather; the saved inputs of q/k/v and gate/up (2 per block) and,
    // on the last stage, the head's gathered again in backward.
    add_ring_traffic(prediction, coll::CollectiveKind::kReduceScatter, "tensor-parallel", input.boundary_bytes,
                     mesh.tensor, hidden * micro_batches);
    add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, "tensor-parallel", input.boundary_bytes, mesh.tensor,
                     (hidden + 2 * own_blocks + (last ? 1 : 0)) * micro_batches);
    // The stage's norm weights (2 per block, the final norm on the last stage; sequence parallelism runs
    // Llama-style models only, every norm weight [h]), their gradients summed over the TP group once per step.
    const uint64_t norms = 2 * own_blocks + (last ? 1 : 0);
    const uint64_t norm = input.replicated_tensors > 0 ? input.replicated_elements / input.replicated_tensors : 0;
    if (!per_norm_dtype) {
      add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "tensor-parallel", norms * norm * sizeof(float),
                       mesh.tensor);
    } else {
      add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "tensor-parallel",
                       norm * dtype_size(*per_norm_dtype), mesh.tensor, norms);
    }
  } else {
    add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "tensor-parallel", input.boundary_bytes, mesh.tensor,
                     hidden * micro_batches);
  }
  if (last) {
    add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "tensor-parallel", input.tokens * sizeof(float),
                     mesh.tensor, 3 * micro_batches);
  }
}

Updated predict_pipeline(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction) {
  const optim::PrecisionRecipe& recipe = options.recipe;
  const Mesh mesh = mesh_of(options, input.world, input.rank);
  const int stages = mesh.pipeline;
  const int stage = mesh.pipeline_rank();
  const int chunks = options.pipeline.virtual_stages;
  const std::vector<StageBlocks> mine = predicted_stage_chunks(options, input, stages, stage);
  Updated held;
  uint64_t own_blocks = 0;
  for (const StageBlocks& chunk : mine) {
    for (int u = chunk.first; u <= chunk.last; ++u) held.emplace_back(u, input.unit_counts[static_cast<size_t>(u)]);
    own_blocks += static_cast<uint64_t>(chunk.last - chunk.first + 1);
  }
  uint64_t root = 0;
  if (stage == 0) root += input.root_first_stage;
  if (stage == stages - 1) root += input.root_last_stage;
  if (stage == 0 && stage == stages - 1) root -= input.tied_embedding;  // one stage: the table once
  if (root > 0) held.emplace_back(AnalyticInput::kCharged, root);
  const bool distributed = options.parallel.distributed_optimizer && mesh.data > 1;
  Updated updated;
  for (const auto& [unit, elements] : held) {
    add_megatron_unit(prediction, updated, input, recipe, mesh, distributed, unit, elements);
  }
  const uint64_t micro_batches = static_cast<uint64_t>(input.accumulation);
  const auto v = static_cast<uint64_t>(chunks);
  const uint64_t sends = micro_batches * ((stage < stages - 1 ? v : v - 1) + (stage > 0 ? v : v - 1));
  if (sends > 0) {
    prediction.traffic.push_back({coll::CollectiveKind::kSend, mesh.data > 1 || mesh.tensor > 1 ? "pipeline" : "world",
                                  sends, sends * stage_boundary_bytes(input, mesh)});
  }
  if (mesh.tensor > 1) add_stage_tensor_traffic(prediction, input, mesh, own_blocks);
  if (stages > 1 && input.tied_embedding > 0 && (stage == 0 || stage == stages - 1)) {
    add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, "embedding group",
                     input.bytes(AnalyticInput::kCharged, input.tied_embedding, recipe.grads), 2);
  }
  std::vector<std::string> ranges;
  ranges.reserve(mine.size());
  for (const StageBlocks& chunk : mine) ranges.push_back(fmt::format("{}..{}", chunk.first, chunk.last));
  prediction.formula = fmt::format("16Ψ_s: stage {} of {}, blocks {}", stage, stages, fmt::join(ranges, ", "));
  return updated;
}

}  // namespace emu::strategy
