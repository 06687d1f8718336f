// Closed forms of the model's memory terms, in bytes, for the shrink report and for tests against the allocator.
//
// Saved activations of one block (what it keeps from forward to backward), as Hugging Face's modelling code keeps
// them (blocks.h lists the tensors), T = b·s, e = bytes of the compute dtype (2 for bf16, 4 for fp32), d = h/a,
// kvd = kv·d, kvc = h for eager attention under grouped-query attention (repeat_kv's copies) else kvd:
//
//   Llama   8·T·h + e·T·(6h + 2·kvc + 4F) + 8T   + attention
//           per RMSNorm its input in fp32 (4Th), the normalised tensor and the output (2eTh) and rstd (4T);
//           q, attention output; k, v; gate, silu(gate), up, silu(gate)·up. Qwen2's q/k/v biases add nothing
//           saved. Phi-3 (fused qkv_proj, gate_up_proj) keeps what Llama keeps: k and v reach attention as the
//           cache's copies (use_cache, the training default without checkpointing), so the fused qkv output is
//           freed after rotary embedding, and gate_up's [T, 2F] output is what Llama's gate and up are (SiLU saves
//           the gate half, the product the up half). Gemma: GeGLU keeps what SwiGLU does (gelu saves its input);
//           its RMSNorm multiplies by (1 + weight) in fp32 before casting back, so the normalised tensor is kept
//           in fp32: + 2·(4 − e)·T·h, and (1 + weight) [h] fp32 per norm: + 8h (charged ÷ k like a per-row term)
//   GPT-2   e·T·(8h + 5F) + 16T                  + attention
//           x, ln_1 output, qkv (3h), attention output, x2, ln_2 output; c_fc output and gelu_new's tanh, 0.5·x,
//           1 + tanh and product; two fp32 mean/rstd pairs
//   attention: eager, Llama (4 + e)·b·a·s² at e = 2 (fp32 softmax and its bf16 copy), 4·b·a·s² at e = 4; GPT-2
//           e·b·a·s². sdpa and flash 4·b·a·s (one fp32 logsumexp per row; sdpa at e = 4 pads s to a multiple of 32)
//   with checkpointing: e·T·h (the block input only); the rest exists only while the block is (re)computed.
//   with selective recomputation (ModelOptions::selective_recompute): the attention term is 0 (run again in
//           backward); everything else as without it.
//   under tp's sequence parallelism over t ranks (Llama): the norm-region terms 8·T·h + 4·e·T·h + 8T (the fp32
//           norm inputs, the normalised tensors and outputs, rstd) are the rank's T/t rows; with checkpointing
//           e·T·h/t. The terms between the column- and row-parallel layers are those of the rank's heads and F/t.
//   under autocast (fp32 parameters, bf16 math; blocks.h), attention as at e = 2, GPT-2's eager softmax too:
//     Llama   (16 + 2·casts)·T·h + 4·T·qd + 4·T·kvc + 8·T·F + 8T + attention, casts = 5 (q, k, v, gate and up
//             projections each save a bf16 cast of an fp32 norm output; Phi-3's fused projections 2): the fp32 block
//             input and residual after attention (8Th), two fp32 normalised tensors (8Th), q and the attention
//             output (4·T·qd, qd = h but for Gemma 2). Gemma's (1 + weight) 8h as in bf16. Gemma 2's norms on the
//             o_proj and down_proj outputs (bf16) keep what they keep in bf16, 2·(8·T·h + 4T + 4h): the fp32 copy
//             of their input, rstd, the fp32 normalised tensor, (1 + weight); their outputs are cast back to bf16
//             (type_as) and only added to the fp32 stream. Its eager attention keeps the soft-cap's tanh in bf16
//             beside the fp32 softmax and its bf16 cast: 8·b·a·s²
//     GPT-2   20·T·h + 16·T·F + 16T + attention: the fp32 input and residual (8Th), two bf16 norm-output casts (4Th),
//             qkv (6Th), attention output (2Th); gelu_new with pow in fp32: c_fc's output in fp32, tanh and
//             1 + tanh in fp32 (12TF), 0.5·x and c_proj's cast of the product in bf16 (4TF)
//     with checkpointing 4·T·h, the fp32 block input. Autocast's bf16 weight casts are the strategy's.
// In a config shrunk by k the per-row terms (8T, 16T, 4·b·a·s) scale by k only; they are charged, and counted
// here, at their full-scale bytes ÷ k²: each buffer's bytes / k, rounded up (shrink.h, per_row_charge).
//
// Against emu's earlier closed form (e·T·(6h + 2kvd + 3F) + 8T for Llama, e·T·(8h + 2F) + 16T for GPT-2) a Llama
// block keeps 8Th + eTh + eTF more (1.42× for Llama 2 7B in bf16, 1.29× in fp32) and a GPT-2 block 3eTF more.
//
// Relation to Korthikanti et al. 2022 (Eq. 1), s·b·h·(34 + 5·a·s/h) bytes for GPT-style blocks with F = 4h, 16-bit
// activations and dropout. Their 34 = 4 (two LayerNorm inputs) + 2 (QKV input) + 6 (q, k, v) + 2 (output-projection
// input) + 2 (MLP input) + 8 (c_fc output) + 8 (GELU output) + 2 (two 1-byte dropout masks after attention and
// MLP); their 5·a·s/h = 2 (softmax output) + 1 (dropout mask) + 2 (dropout output) per score. HF's GPT-2 block at
// e = 2 without dropout keeps s·b·h·(56 + 2·a·s/h) + 16·s·b with eager attention: the masks and the dropout output
// go, gelu_new's three extra [T, F] intermediates (24·sbh) and the fp32 LayerNorm statistics come in.
//
// The loss (config.h Loss), V the vocabulary: the Trainer's keeps 4·T·V after forward (the fp32 log-softmax), holds
// (e + 4 + 4)·T·V at the forward's peak in bf16 (8·T·V in fp32: the upcast is the logits themselves) and 12·T·V in
// its backward (the log-softmax, its gradient and the logits' gradient, fp32); fused, 4·T·V throughout, and e·T·h
// more for the head's input gradient in backward. Under autocast the head's bf16 cast of the fp32 final norm output
// (e·T·h) comes on top of the forward's peak.
#pragma once

#include <cstdint>

#include "workloads/model/config.h"

namespace emu::model {

// Bytes one block keeps from its forward to its backward. `sequence_ranks`: t under tp's sequence parallelism, whose
// residual stream and norms keep T/t rows (`config` is then a TP rank's slice, tensor_parallel_config).
uint64_t saved_activation_bytes_per_block(const ModelConfig& config, const ModelOptions& options,
                                          int sequence_ranks = 1);
// The fp32 [T, V] buffer the loss keeps from forward to backward (the log-softmax, or the fused loss's logits), and
// under the Trainer's loss Gemma 2's tanh(logits / final_logit_softcapping) [T, V] at the compute dtype.
uint64_t logits_bytes(const ModelConfig& config, const ModelOptions& options);
// What the loss holds at the peak of its forward and of its backward, above the final norm's output.
uint64_t loss_forward_peak_bytes(const ModelConfig& config, const ModelOptions& options);
uint64_t loss_backward_peak_bytes(const ModelConfig& config, const ModelOptions& options);
// What the model holds at the end of forward: every block's saved activations plus the logits.
uint64_t saved_activation_bytes(const ModelConfig& config, const ModelOptions& options, int sequence_ranks = 1);

// Parameter elements split by how they scale under shrinking.
struct ParameterTerms {
  uint64_t block_matrices = 0;  // ∝ h², h·F: exactly 1/k²
  uint64_t vector_params = 0;   // norm weights and biases ∝ h or F: 1/k
  uint64_t embeddings = 0;      // token embedding, LM head, position table ∝ V·h, s·h: 1/k² up to rounding
  uint64_t total() const { return block_matrices + vector_params + embeddings; }
};
ParameterTerms parameter_terms(const ModelConfig& config);

}  // namespace emu::model
