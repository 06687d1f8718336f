// One transformer block's forward and backward, Llama or GPT-2 style, allocating what a GPU would hold.
//
// Saved tensors (kept from forward to backward) are charged to the category the caller gives (kActivations, or
// kTemporaries for the forward of a checkpointed block, whose tensors are dropped when it ends); gradients of
// activations in backward are kTemporaries. Everything is at the compute dtype except the norm statistics and the
// flash logsumexp, which are fp32 as GPU kernels keep them. The tensors a block saves, T = b·s, e = bytes of the
// compute dtype, d = h/a (see memory_terms.h for the closed form):
//
//   Llama  x, xn1, q, attn, x2, xn2 [T, h]; k, v [T, kv·d]; gate, up, act [T, F]; rstd1, rstd2 [T] fp32;
//          classic: probs [b, a, s, s]; flash: lse [b, a, s] fp32
//   GPT-2  x, xn1, attn, x2, xn2 [T, h]; qkv [T, 3h]; fc, act [T, F]; mean/rstd 1 and 2 [2, T] fp32;
//          classic: probs [b, a, s, s]; flash: lse [b, a, s] fp32
#pragma once

#include <string_view>

#include "emu/device.h"
#include "emu/ops.h"
#include "workloads/model/config.h"
#include "workloads/model/layout.h"

namespace emu::model {

// What a block reads besides its weights and saved tensors.
struct BlockEnv {
  Device& device;
  const ModelConfig& config;
  const ModelOptions& options;
  const UnitLayout& layout;
  int unit = 0;                     // 1..L, for names in out-of-memory reports
  const float* rope_cos = nullptr;  // [s, d/2] Llama only
  const float* rope_sin = nullptr;  // [s, d/2]
  bool math = true;                 // false on a shapes-only device: allocate, compute nothing
  Ops* ops = nullptr;               // the device's ops (Device::ops); null when !math

  Buffer allocate(size_t count, DType dtype, Category category, std::string_view what) const;
  // A per-row statistic (∝ T or b·a·s, scaling by k): charged at full scale ÷ k² (shrink.h, allocate_per_row).
  Buffer allocate_per_row(size_t count, DType dtype, Category category, std::string_view what) const;
};

// The tensors a block saves for backward; unused ones stay unallocated.
struct BlockSaved {
  Buffer x;            // [T, h] block input
  Buffer norm1_stats;  // [T] rstd (Llama) or [2, T] mean then rstd (GPT-2), fp32
  Buffer xn1;          // [T, h] first norm's output
  Buffer q, k, v;      // Llama: q [T, h], k and v [T, kv·d], after rotary embedding
  Buffer qkv;          // GPT-2: [T, 3h], q | k | v column blocks
  Buffer probs;        // classic: [b, a, s, s]
  Buffer lse;          // flash: [b, a, s] fp32
  Buffer attn;         // [T, h] attention output, input of the output projection
  Buffer x2;           // [T, h] residual stream after attention
  Buffer norm2_stats;  // as norm1_stats
  Buffer xn2;          // [T, h] second norm's output
  Buffer gate, up;     // Llama: [T, F] each
  Buffer fc;           // GPT-2: [T, F] pre-activation
  Buffer act;          // [T, F] input of the MLP's output projection

  // Releases everything but the block input (what checkpointing keeps).
  void release_all_but_input();
};

// Runs the block on x (moved into saved.x) and returns its output [T, h], charged to `output_category`.
// `weights` is the unit's flat fp32 buffer (null when !env.math).
Buffer block_forward(const BlockEnv& env, const float* weights, Buffer x, BlockSaved& saved, Category saved_category,
                     Category output_category);

// dres [T, h] fp32: on entry the gradient of the block output, on exit that of the block input. Accumulates the
// block's weight gradients into dweights (flat fp32, the unit's layout) and releases the saved tensors as soon as
// they are used for the last time.
void block_backward(const BlockEnv& env, const float* weights, BlockSaved& saved, float* dres, float* dweights);

}  // namespace emu::model
