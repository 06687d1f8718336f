// tp's lines in the report (report.h, format_tensor): the split, Megatron's vocabulary padding and its bytes, the
// precision recipe, and the collectives of a step (with sequence parallelism its reduce-scatters and all-gathers).
#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>

#include "app/report.h"
#include "workloads/model/tensor_parallel.h"

namespace emu::app {
namespace {
std::string gigabytes(double bytes) { return fmt::format("{:.2f}", bytes / 1e9); }

// Rank 0's bytes and calls per step of one kind inside the tensor-parallel group, or (data) in the data-parallel
// group whatever the kind.
std::pair<double, uint64_t> step_traffic(const StrategyOutcome& o, coll::CollectiveKind kind, bool data = false) {
  const auto counted = [&](const auto& key) {
    return (key.group == "data-parallel") == data && (data || key.kind == kind);
  };
  double sent = 0;
  uint64_t calls = 0;
  for (const auto& [key, traffic] : o.traffic_per_step) {
    if (counted(key)) sent += static_cast<double>(traffic.sent);
  }
  for (const auto& [key, count] : o.calls_per_step) {
    if (counted(key)) calls += count;
  }
  return {sent, calls};
}

// The all-reduces of a step in the model's own names (Llama's Hugging Face names, or GPT-2's), and with sequence
// parallelism what is left of them.
std::string all_reduce_text(const model::ModelConfig& full, bool sequence_parallel) {
  if (sequence_parallel) {
    return "3 of b*s fp32 per micro-batch (parallel cross-entropy) and the norm weights' gradients once";
  }
  const bool gpt2 = full.style == model::Style::kGpt2;
  return fmt::format(
      "per micro-batch 4L+2 of b*s*h (after {} in forward, the {} input gradients in backward, the embedding output "
      "and the head's input gradient; again the 2 forward ones of a checkpointed block) and 3 of b*s fp32 (parallel "
      "cross-entropy), ring 2(t-1)/t",
      gpt2 ? "attn.c_proj and mlp.c_proj" : "o_proj and down_proj", gpt2 ? "c_attn and c_fc" : "q/k/v and gate/up");
}

// The tensors every rank holds whole: the norm weights, and GPT-2's c_proj biases and positions.
std::string_view replicated_text(const model::ModelConfig& full) {
  return full.style == model::Style::kGpt2 ? "LayerNorms, c_proj biases (added after the all-reduce) and wpe"
                                           : "norm weights";
}
// zero1/zero2 --tp: the split and DeepSpeed's partitions over the replicas (nothing for a run that did not start).
std::string zero_over_tensor_lines(const RunReport& r, const StrategyOutcome& o) {
  if (o.peak.empty()) return "";
  const model::ModelConfig& full = r.options.full;
  const strategy::Mesh mesh = strategy::mesh_of(o.options, r.world, 0);
  const int t = mesh.tensor;
  return fmt::format(
      "\n{}: DeepSpeed's ZeRO-{} over the {} replicas of tensor-parallel groups of t = {} (Megatron-DeepSpeed: "
      "partitions over mpu.get_data_parallel_group()): each rank holds heads {}/{}, kv heads {}/{}, FFN {}/{} and "
      "{} of the padded vocabulary's {} rows; its flat bf16 group partitioned over the replicas, rank 0 sending "
      "{} GB per step in the data-parallel group; {} counted once in the gradient norm\n",
      o.name, o.options.kind == strategy::StrategyKind::kZero1 ? 1 : 2, mesh.data, t, full.heads, t, full.kv_heads, t,
      full.ffn, t, model::tp_padded_vocab(full, t) / t, model::tp_padded_vocab(full, t),
      gigabytes(step_traffic(o, coll::CollectiveKind::kAllReduce, true).first * static_cast<double>(r.scale())),
      replicated_text(full));
}

// Whether `o` is ZeRO-3 or FSDP1 over tensor-parallel layers (zero3, fsdp --tp T: sharded_units.h) that ran.
bool flat_sharded(const StrategyOutcome& o) {
  return o.options.kind != strategy::StrategyKind::kFsdp2 && strategy::sharded_over_layout(o.options.kind) &&
         o.options.parallel.tensor > 1 && !o.peak.empty();
}

// Its line.
std::string flat_sharded_text(const StrategyOutcome& o, const model::ModelConfig& full, int world) {
  const strategy::Mesh mesh = strategy::mesh_of(o.options, world, 0);
  const bool zero3 = o.options.kind == strategy::StrategyKind::kZero3;
  return fmt::format(
      "\n{}: {} over the {} replicas of tensor-parallel groups of t = {}: each rank holds heads {}/{}, kv heads {}/{}, "
      "FFN {}/{} and {} of the padded vocabulary's rows; each unit's slice flattened and sharded over the "
      "data-parallel group, the gradient norm summed over it and then over the TP group (norm weights once)\n",
      o.name, zero3 ? "DeepSpeed ZeRO-3 (with Megatron's mpu)" : "FSDP1 (2-D device mesh, use_orig_params)", mesh.data,
      mesh.tensor, full.heads, mesh.tensor, full.kv_heads, mesh.tensor, full.ffn, mesh.tensor,
      model::tp_padded_vocab(full, mesh.tensor) / mesh.tensor);
}
// FSDP2 over tensor-parallel layers: torchtitan's 2-D or 3-D mesh.
std::string fsdp2_over_tensor_text(const StrategyOutcome& o, const model::ModelConfig& full, int world) {
  const strategy::Mesh mesh = strategy::mesh_of(o.options, world, 0);
  const int t = mesh.tensor;
  const std::string mesh_words =
      mesh.pipeline > 1 ? fmt::format("3-D mesh: pipeline_parallel_degree {}, ", mesh.pipeline) : "2-D mesh: ";
  return fmt::format(
      "\n{}: fully_shard over the {} replicas of tensor-parallel groups of t = {} (torchtitan's {}"
      "tensor_parallel_degree {}, data_parallel_shard_degree {}): each rank holds heads {}/{}, kv heads {}/{}, "
      "FFN {}/{} and {} of the vocabulary's rows (padded to {} as Megatron pads it; torchtitan shards {} "
      "unpadded), each tensor sharded on dim 0 over the replicas\n",
      o.name, mesh.data, t, mesh_words, t, mesh.data, full.heads, t, full.kv_heads, t, full.ffn, t,
      model::tp_padded_vocab(full, t) / t, model::tp_padded_vocab(full, t), full.vocab);
}

// The line of a data-parallel strategy over tensor-parallel layers that ran (fsdp2, zero1/2, zero3, fsdp with
// --tp T); empty for any other.
std::string sharded_over_tensor_text(const RunReport& r, const StrategyOutcome& o) {
  if (o.peak.empty()) return "";
  if (o.options.kind == strategy::StrategyKind::kFsdp2 && o.options.parallel.tensor > 1) {
    return fsdp2_over_tensor_text(o, r.options.full, r.world);
  }
  if (strategy::zero12_over_tensor(o.options)) return zero_over_tensor_lines(r, o);
  if (flat_sharded(o)) return flat_sharded_text(o, r.options.full, r.world);
  return "";
}
}  // namespace

std::string format_tensor(const RunReport& r) {
  std::string out;
  const double scale = static_cast<double>(r.scale());
  const model::ModelConfig& full = r.options.full;
  const bool sp = r.options.model_options.sequence_parallel;
  for (const StrategyOutcome& o : r.outcomes) {
    if (std::string text = sharded_over_tensor_text(r, o); !text.empty()) {
      out += text;
      continue;
    }
    if (o.options.kind != strategy::StrategyKind::kTensor || o.peak.empty()) continue;
    const strategy::Mesh mesh = strategy::mesh_of(o.options, r.world, 0);
    const int t = mesh.tensor;
    const bool distributed = mesh.data > 1 && o.options.parallel.distributed_optimizer;
    const optim::PrecisionRecipe recipe = strategy::with_framework_recipe(o.options).recipe;
    const int64_t padded = model::tp_padded_vocab(full, t);
    const int64_t padding_rows = padded - full.vocab;
    const uint64_t padding_params =
        static_cast<uint64_t>(padding_rows) * static_cast<uint64_t>(full.hidden) * (full.tie_embeddings ? 1 : 2);
    const uint64_t padding_per_rank = padding_params / static_cast<uint64_t>(t);
    out += fmt::format(
        "\n{}: {} of t = {} (Megatron-LM --tensor-model-parallel-size {}){}: each rank holds "
        "heads {}/{}, kv heads {}/{}, FFN {}/{} and {} of the padded vocabulary's rows\n",
        o.name,
        mesh.data > 1 ? fmt::format("{} tensor-parallel groups", mesh.data) : std::string("one tensor-parallel group"),
        t, t, mesh.data > 1 ? fmt::format(", data-parallel across the {} groups", mesh.data) : std::string(),
        full.heads, t, full.kv_heads, t, full.ffn, t, padded / t);
    out += fmt::format(
        "  vocabulary padded as Megatron pads it (--make-vocab-size-divisible-by 128, x t): V {} -> {} (+{} rows of "
        "the embedding{}): {} parameters, {} GB per rank at {} B/param\n",
        full.vocab, padded, padding_rows, full.tie_embeddings ? ", tied head" : " and of the head", padding_per_rank,
        gigabytes(static_cast<double>(padding_per_rank * recipe.total_bytes_per_param())),
        recipe.total_bytes_per_param());
    out += fmt::format(
        "  recipe: {} B per local parameter ({} parameters, {} gradients{}, Adam m and v; Megatron's optimizer "
        "{}); {} replicated, {}\n",
        recipe.total_bytes_per_param(), dtype_name(recipe.params), dtype_name(recipe.grads),
        recipe.has_master ? ", fp32 master weights" : "",
        distributed ? fmt::format("with --use-distributed-optimizer: master weights and Adam m, v sharded over the D = "
                                  "{} replicas, {} + {}/{} B",
                                  mesh.data, dtype_size(recipe.params) + dtype_size(recipe.grads),
                                  recipe.total_bytes_per_param() - dtype_size(recipe.params) - dtype_size(recipe.grads),
                                  mesh.data)
                    : std::string("without --use-distributed-optimizer"),
        replicated_text(full),
        sp ? "their gradients (each rank's rows) all-reduced once per step"
           : "their gradients identical on every rank");
    const std::string_view recompute =
        r.options.model_options.checkpoint ? "full (every block's forward)"
        : r.options.model_options.selective_recompute
            ? "selective (the attention core; Megatron --recompute-granularity selective)"
            : "none";
    if (sp) {
      const auto [scattered, scatters] = step_traffic(o, coll::CollectiveKind::kReduceScatter);
      const auto [gathered, gathers] = step_traffic(o, coll::CollectiveKind::kAllGather);
      out += fmt::format(
          "  sequence parallel (Megatron --sequence-parallel): norms and residual stream on {}/{} of the sequence; "
          "recompute {}\n  reduce-scatter: rank 0 sends {} GB per step in {} calls, all-gather {} GB in {} calls "
          "(per micro-batch 4L+2 of each in place of the all-reduces of b*s*h, ring (t-1)/t each, and 2L+1 "
          "all-gathers more: the saved 1/t inputs of q/k/v, gate/up and the head again for the weight gradients)\n",
          full.seq / t, full.seq, recompute, gigabytes(scattered * scale), scatters, gigabytes(gathered * scale),
          gathers);
    } else if (r.options.model_options.selective_recompute) {
      out += fmt::format("  recompute {}\n", recompute);
    }
    const std::string reduced = all_reduce_text(full, sp);
    const auto [sent, calls] = step_traffic(o, coll::CollectiveKind::kAllReduce);
    out += fmt::format("  all-reduce: rank 0 sends {} GB per step in {} calls: {}\n", gigabytes(sent * scale), calls,
                       reduced);
    if (mesh.data > 1) {
      const auto [data_sent, data_calls] = step_traffic(o, coll::CollectiveKind::kAllReduce, true);
      out += fmt::format(
          "  data-parallel group (D = {}): rank 0 sends {} GB per step in {} calls: {} (Megatron-LM's "
          "DistributedDataParallel grad buffer, one bucket per unit)\n",
          mesh.data, gigabytes(data_sent * scale), data_calls,
          distributed ? "each unit's gradients reduce-scattered and its parameters all-gathered, ring (D-1)/D each"
                      : "all-reduces of its local gradients, ring 2(D-1)/D");
    }
  }
  return out;
}

}  // namespace emu::app
