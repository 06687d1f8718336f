// The analytic model of tensor parallelism (tensor_parallel.cpp), for one rank of a TP group of t = input.world
// (every rank alike), from Megatron-LM's arithmetic (Shoeybi et al. 2019, §3; Korthikanti et al. 2022, §4):
//   Ψ/t         the rank's slice: the model's units as the rank holds them (a/t heads, F/t, the padded V'/t rows of
//               the embedding and head), the norm weights whole (GPT-2: its LayerNorms,
//               c_proj biases and wpe too)
//   memory      parameters 2Ψ/t, fp32 main gradients 4Ψ/t, master weights 4Ψ/t, Adam m and v 8Ψ/t: 18Ψ/t in
//               Megatron's mixed recipe (16Ψ/t in fp32)
//   traffic     per micro-batch (M = input.accumulation of them per step), all-reduces within the group at ring
//               volume 2(t − 1)/t of the payload:
//                 forward   2 per block (after o_proj and after down_proj: Megatron's g) + 1 (embedding output)
//                 backward  2 per block (the q/k/v and gate/up inputs' gradients: f) + 1 (the LM head's input)
//                           [+ 2 per block again when blocks are checkpointed: the recomputed forward's g]
//               each of b·s·h at the compute dtype, and 3 of b·s fp32 (parallel cross-entropy: max, target logit,
//               Σexp). So (4L + 2)·M all-reduces of b·s·h·e per step without checkpointing.
//   sequence parallelism: each of those all-reduces becomes a reduce-scatter and an all-gather of the same b·s·h·e
//               payload, each sending (t − 1)/t of it (so (4L + 2)·M of each, the same bytes), plus (2L + 1)·M
//               all-gathers in backward (the saved 1/t inputs of q/k/v, gate/up and the head gathered again for the
//               weight gradients; Korthikanti et al. 2022 §4.2.2) and one all-reduce per step of the norm weights'
//               gradients (2L + 1)·h fp32 (the replicated elements).
//   data        with D = N/t > 1 replicas (--tp t < N): the TP traffic in the "tensor-parallel" group, and per step
//               one all-reduce of each unit's local gradients in the "data-parallel" group, 2(D − 1)/D of them;
//               with the distributed optimizer the optimizer state of 1/D of each unit (12/D bytes per local
//               parameter: 6 + 12/D in all), a reduce-scatter of the gradients and an all-gather of the parameters
//               instead, (D − 1)/D each (exact where D divides the unit)
#include <fmt/format.h>

#include "strategies/analytic.h"
#include "strategies/shard.h"

namespace emu::strategy {

Updated predict_tensor_parallel(const StrategyOptions& options, const AnalyticInput& input, Prediction& prediction) {
  const optim::PrecisionRecipe& recipe = options.recipe;
  const Mesh mesh = mesh_of(options, input.world, input.rank);
  const int tp = mesh.tensor;
  const std::string group = mesh.data > 1 ? "tensor-parallel" : "world";
  const bool distributed = options.parallel.distributed_optimizer && mesh.data > 1;
  Updated updated;
  for (size_t u = 0; u < input.unit_counts.size(); ++u) {
    add_megatron_unit(prediction, updated, input, recipe, mesh, distributed, static_cast<int>(u), input.unit_counts[u]);
  }
  add_tensor_parallel_traffic(prediction, input, group, tp);
  prediction.formula =
      distributed
          ? fmt::format(
                "({} + {}/D)Ψ/t, t = {}, D = {}: the slice of every matrix, the optimizer sharded over the "
                "replicas (Megatron-LM's distributed optimizer)",
                recipe.total_bytes_per_param() - 2 * dtype_size(recipe.moments) - (recipe.has_master ? 4 : 0),
                2 * dtype_size(recipe.moments) + (recipe.has_master ? 4 : 0), tp, mesh.data)
          : fmt::format("{}Ψ/t, t = {}: the slice of every matrix (Megatron-LM)", recipe.total_bytes_per_param(), tp);
  return updated;
}

void add_tensor_parallel_traffic(Prediction& prediction, const AnalyticInput& input, const std::string& group, int tp,
                                 bool norm_grads_per_backward, DType norm_grad_dtype) {
  const uint64_t blocks = input.unit_counts.empty() ? 0 : input.unit_counts.size() - 1;
  const uint64_t micro_batches = static_cast<uint64_t>(input.accumulation);
  const uint64_t per_block = input.checkpoint ? 6 : 4;
  const uint64_t replaced = (per_block * blocks + 2) * micro_batches;
  if (input.sequence_parallel) {
    add_ring_traffic(prediction, coll::CollectiveKind::kReduceScatter, group, input.boundary_bytes, tp, replaced);
    add_ring_traffic(prediction, coll::CollectiveKind::kAllGather, group, input.boundary_bytes, tp,
                     replaced + (2 * blocks + 1) * micro_batches);
    if (norm_grads_per_backward && input.replicated_tensors > 0) {
      // sequence parallelism runs Llama-style models only: every norm weight is [h], the same payload each
      add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, group,
                       input.replicated_elements / input.replicated_tensors * dtype_size(norm_grad_dtype), tp,
                       input.replicated_tensors * micro_batches);
    } else {
      add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, group, input.replicated_elements * sizeof(float),
                       tp, 1);
    }
  } else {
    add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, group, input.boundary_bytes, tp, replaced);
  }
  add_ring_traffic(prediction, coll::CollectiveKind::kAllReduce, group, input.tokens * sizeof(float), tp,
                   3 * micro_batches);
}

}  // namespace emu::strategy
