#include "workloads/model/memory_terms.h"

#include <algorithm>

#include "workloads/model/layout.h"
#include "workloads/model/shrink.h"

namespace emu::model {

namespace {

// Gemma 2's norms on the attention and MLP outputs: each keeps its input in fp32 (the sublayer's output at e = 4, its
// fp32 copy at e = 2 and under autocast, where the sublayer's output is bf16), rstd, the fp32 normalised tensor and
// (1 + weight); their outputs (cast back to the sublayer's dtype) are only added to the residual stream.
uint64_t sandwich_norm_bytes(const ModelConfig& c, uint64_t T, uint64_t h) {
  return c.sandwich_norms ? 2 * (8 * T * h + per_row_charge(c, 4 * T) + per_row_charge(c, 4 * h)) : 0;
}

// A block under autocast, attention aside (memory_terms.h): the fp32 stream, norms and their statistics, the bf16
// casts the linears save, and what follows them.
uint64_t autocast_block_bytes(const ModelConfig& c, uint64_t T, uint64_t h, uint64_t F, uint64_t kvc) {
  // GPT-2: the fp32 stream and the norms' bf16 casts 12·T·h, qkv and the attention output 8·T·qd (h/t under TP).
  if (c.style == Style::kGpt2)
    return 12 * T * h + 8 * T * uint64_t(c.q_dim()) + 16 * T * F + 2 * per_row_charge(c, 8 * T);
  const uint64_t casts = c.fused_projections ? 2 : 5;  // one per linear reading a norm's output
  // q and the attention output 4·T·qd (qd = h but for Gemma 2).
  return (16 + 2 * casts) * T * h + 4 * T * uint64_t(c.q_dim()) + 4 * T * kvc + 8 * T * F +
         2 * per_row_charge(c, 4 * T) + (c.gemma ? 2 * per_row_charge(c, 4 * h) : 0) + sandwich_norm_bytes(c, T, h);
}

}  // namespace

uint64_t saved_activation_bytes_per_block(const ModelConfig& c, const ModelOptions& options, int sequence_ranks) {
  const uint64_t e = dtype_size(options.compute);
  const uint64_t T = uint64_t(c.tokens()), h = uint64_t(c.hidden), F = uint64_t(c.ffn);
  const uint64_t R = T / uint64_t(std::max(sequence_ranks, 1));  // the rows of the residual stream and the norms
  if (options.checkpoint) return dtype_size(options.residual()) * R * h;
  const uint64_t scores = uint64_t(c.batch * c.heads) * uint64_t(c.seq * c.seq);
  const uint64_t rows =
      options.attention == Attention::kSdpa && e == 4 ? (uint64_t(c.seq) + 31) / 32 * 32 : uint64_t(c.seq);
  const bool llama = c.style == Style::kLlama;
  // Per-row statistics are charged at full scale ÷ k² in a shrunk run (shrink.h): each buffer bytes / k, rounded up.
  uint64_t attention = per_row_charge(c, 4 * uint64_t(c.batch * c.heads) * rows);
  if (options.attention == Attention::kEager) {
    attention = (llama || options.autocast ? (e == 2 ? 4 + e : 4) : e) * scores;
  }
  // Gemma 2's eager attention also keeps tanh(scores / cap), tanh's output, at e.
  if (options.attention == Attention::kEager && c.attn_softcap != 0) attention += e * scores;
  if (options.selective_recompute) attention = 0;  // run again in backward, saved by none
  const uint64_t qd = uint64_t(c.q_dim());         // q and the attention output: h but for Gemma 2
  const uint64_t kvc = options.attention == Attention::kEager && c.kv_heads < c.heads ? qd : uint64_t(c.kv_dim());
  if (options.autocast) return autocast_block_bytes(c, T, h, F, kvc) + attention;
  if (llama) {
    // Gemma's norms keep the normalised tensor in fp32 (not at e) and (1 + weight) [h] fp32, a per-row-like term.
    const uint64_t gemma = c.gemma ? 2 * (4 - e) * R * h + 2 * per_row_charge(c, 4 * h) : 0;
    return 8 * R * h + e * R * 4 * h + 2 * per_row_charge(c, 4 * R) + e * T * (2 * qd + 2 * kvc + 4 * F) + attention +
           gemma + sandwich_norm_bytes(c, T, h);
  }
  // GPT-2: the block input, ln_1's output, the residual after attention and ln_2's output [T, h]; qkv and the
  // attention output 4·[T, qd] (qd = h, or h/t on a tensor-parallel rank); c_fc's output and gelu_new's four [T, F].
  return e * T * (4 * h + 4 * qd + 5 * F) + 2 * per_row_charge(c, 8 * T) + attention;
}

// The fp32 log-softmax (or the fused loss's buffer), and Gemma 2's tanh(logits / cap) at e under the Trainer's loss.
uint64_t logits_bytes(const ModelConfig& c, const ModelOptions& options) {
  const uint64_t tv = uint64_t(c.tokens()) * uint64_t(c.vocab);
  const bool capped = c.final_softcap != 0 && options.loss == Loss::kTrainer;
  return 4 * tv + (capped ? dtype_size(options.compute) * tv : 0);
}

uint64_t loss_forward_peak_bytes(const ModelConfig& c, const ModelOptions& options) {
  const uint64_t tv = uint64_t(c.tokens()) * uint64_t(c.vocab), e = dtype_size(options.compute);
  // Under autocast the head saves a bf16 cast of the fp32 final norm output.
  const uint64_t cast = options.autocast ? e * uint64_t(c.tokens() * c.hidden) : 0;
  if (options.loss == Loss::kFused) return 4 * tv + cast;
  // Gemma 2: tanh(logits / cap) stays beside the capped logits, their upcast and the log-softmax.
  const uint64_t capped = c.final_softcap != 0 ? e * tv : 0;
  return (e + (e == 4 ? 0 : 4) + 4) * tv + capped + cast;
}

uint64_t loss_backward_peak_bytes(const ModelConfig& c, const ModelOptions& options) {
  const uint64_t tv = uint64_t(c.tokens()) * uint64_t(c.vocab);
  // Fused: the logits' gradient beside the head's input gradient [T, h]; the Trainer's three fp32 [T, V] tensors
  // come first and are more (V > h/4 for every model).
  if (options.loss == Loss::kFused) return 4 * tv + dtype_size(options.compute) * uint64_t(c.tokens() * c.hidden);
  // Gemma 2: the saved tanh(logits / cap) is alive until the soft-cap's backward, after the three fp32 tensors.
  return 12 * tv + (c.final_softcap != 0 ? dtype_size(options.compute) * tv : 0);
}

ParameterTerms parameter_terms(const ModelConfig& config) {
  ParameterTerms terms;
  const std::vector<UnitLayout> units = build_layouts(config);
  for (size_t u = 0; u < units.size(); ++u) {
    for (const ParamInfo& p : units[u].params) {
      if (p.shape.size() < 2) {
        terms.vector_params += p.count;
      } else if (u == 0) {
        terms.embeddings += p.count;
      } else {
        terms.block_matrices += p.count;
      }
    }
  }
  return terms;
}

uint64_t saved_activation_bytes(const ModelConfig& config, const ModelOptions& options, int sequence_ranks) {
  return saved_activation_bytes_per_block(config, options, sequence_ranks) * static_cast<uint64_t>(config.layers) +
         logits_bytes(config, options);
}

}  // namespace emu::model
