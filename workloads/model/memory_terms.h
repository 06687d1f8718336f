// Closed forms of the model's memory terms, in bytes, for the shrink report and for tests against the allocator.
//
// Saved activations of one block (what it keeps from forward to backward), T = b·s, e = bytes of the compute
// dtype (2 for bf16, 4 for fp32), d = h/a, kvd = kv·d; norm statistics and the flash logsumexp are fp32:
//
//   Llama   e·T·(6h + 2·kvd + 3F) + 8T      + attention
//           x, xn1, q, attn, x2, xn2; k, v; gate, up, silu(gate)·up; two rstd rows
//   GPT-2   e·T·(8h + 2F) + 16T             + attention
//           x, xn1, attn, x2, xn2 and qkv (3h); c_fc output and gelu output; two mean/rstd pairs
//   attention: classic e·b·a·s² (the probabilities), flash 4·b·a·s (one logsumexp per row)
//   with checkpointing: e·T·h (the block input only); the rest exists only while the block is (re)computed.
// In a config shrunk by k the per-row terms (8T, 16T, 4·b·a·s) scale by k only; they are charged, and counted
// here, at their full-scale bytes ÷ k²: each buffer's bytes / k, rounded up (shrink.h, per_row_charge).
//
// Relation to Korthikanti et al. 2022 (Eq. 1), s·b·h·(34 + 5·a·s/h) bytes for GPT-style blocks with F = 4h, 16-bit
// activations and dropout. Their 34 = 4 (two LayerNorm inputs) + 2 (QKV input) + 6 (q, k, v) + 2 (output-projection
// input) + 2 (MLP input) + 8 (c_fc output) + 8 (GELU output) + 2 (two 1-byte dropout masks after attention and
// MLP); their 5·a·s/h = 2 (softmax output) + 1 (dropout mask) + 2 (dropout output) per score. emu's GPT-2 block at
// e = 2 has no dropout, so s·b·h·(32 + 2·a·s/h) + 16·s·b: the 2 mask bytes and 3 of 5 attention terms go, the
// fp32 LayerNorm statistics (which they neglect) come in. Flash-style attention replaces 2·a·s/h with 4·a/h.
// A Llama block has no biases or dropout but three F-wide tensors (SwiGLU) and narrower k, v under GQA.
#pragma once

#include <cstdint>

#include "workloads/model/config.h"

namespace emu::model {

// Bytes one block keeps from its forward to its backward.
uint64_t saved_activation_bytes_per_block(const ModelConfig& config, const ModelOptions& options);
// The fp32 [T, V] logits buffer.
uint64_t logits_bytes(const ModelConfig& config);
// What the model holds at the end of forward: every block's saved activations plus the logits.
uint64_t saved_activation_bytes(const ModelConfig& config, const ModelOptions& options);

// Parameter elements split by how they scale under shrinking.
struct ParameterTerms {
  uint64_t block_matrices = 0;  // ∝ h², h·F: exactly 1/k²
  uint64_t vector_params = 0;   // norm weights and biases ∝ h or F: 1/k
  uint64_t embeddings = 0;      // token embedding, LM head, position table ∝ V·h, s·h: 1/k² up to rounding
  uint64_t total() const { return block_matrices + vector_params + embeddings; }
};
ParameterTerms parameter_terms(const ModelConfig& config);

}  // namespace emu::model
