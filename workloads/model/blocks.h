// One transformer block's forward and backward, Llama or GPT-2 style, allocating what a GPU would hold.
//
// The tensors a block keeps for backward are the ones Hugging Face's modelling code leaves to autograd (transformers
// models/llama/modeling_llama.py, models/gpt2/modeling_gpt2.py, activations.py; compared with a recorded run in
// tests/unit/hf_oracle_test.cpp). Saved tensors are charged to the category the caller gives (kActivations, or
// kTemporaries for the forward of a checkpointed block, whose tensors are dropped when it ends); gradients of
// activations in backward, and tensors an op holds only while it runs, are kTemporaries. T = b·s, e = bytes of the
// compute dtype, d = h/a, kvd = kv·d (memory_terms.h has the closed form):
//
//   Llama  per RMSNorm (LlamaRMSNorm.forward): its input in fp32 [T, h] (hidden_states.to(float32): a copy at
//          e = 2, the input itself at e = 4), rstd [T] fp32, the normalised tensor .to(input dtype) [T, h] and the
//          output [T, h]; q [T, h]; k, v [T, kvd] after rotary embedding (eager with kv < a: repeat_kv's copies
//          [T, h]); the attention output [T, h]; gate, silu(gate), up and silu(gate)·up [T, F]. At e = 2 the block
//          input and the residual after attention are not kept, only their fp32 copies. Qwen2 (q/k/v biases) and
//          Phi-3 (fused qkv_proj and gate_up_proj, computed as their q, k, v and gate, up row blocks) keep the same.
//   GPT-2  per LayerNorm: its input [T, h], mean and rstd [T] fp32, the output [T, h]; qkv [T, 3h]; the attention
//          output [T, h]; c_fc's output and, of gelu_new (NewGELUActivation, written out in Python), tanh(...),
//          0.5·x, 1 + tanh(...) and their product [T, F] each. Its backward makes gelu_new's gradients node by node as
//          autograd does (up to 7 [T, F] tensors at once, blocks.cpp gelu_new_backward); with checkpointing its
//          recomputation stops once c_proj's input is saved again (torch.utils.checkpoint's early stop).
//   attention  eager: Llama the fp32 softmax [b, a, s, s] (softmax(dtype=float32)) plus its copy at the compute
//              dtype when e = 2; GPT-2 the softmax at the compute dtype (fp32 plus its copy under autocast). sdpa and
//              flash: the logsumexp [b, a, s] fp32 (sdpa in fp32 runs the memory-efficient kernel, whose rows are
//              padded to a multiple of 32). Under selective recomputation (ModelOptions::selective_recompute) none
//              of these is saved: backward runs the attention core again and holds them only while its backward runs.
//   sequence parallelism (ModelOptions::sequence_parallel, tensor_parallel.h): the block input, the residual after
//              attention and everything the norms save are the rank's T/t rows; q/k/v and gate/up read the norm
//              output all-gathered ([T, h], held while they run; all-gathered again in their backward).
//   autocast   (ModelOptions::autocast: torch.autocast(bf16) over fp32 parameters, PyTorch DDP's mixed recipe, as
//              CUDA's autocast lists in ATen autocast_mode.h run it) the residual stream is fp32: the embedding
//              output, each block's input and output, x + attention. Norms run in fp32 and save the stream itself,
//              rstd (and the statistics) and an fp32 normalised tensor; their fp32 output is saved by none, and each
//              linear layer reading it saves its own bf16 cast (autocast caches only the parameters' casts): Llama
//              q_proj, k_proj, v_proj, gate_proj and up_proj five [T, h] casts (Phi-3's fused projections two),
//              GPT-2 c_attn and c_fc two. Rotary embedding multiplies by fp32 cos and sin, so q and k reach
//              attention in fp32 and it saves its bf16 casts: the same [T, h] and [T, kvd] as in bf16. Everything
//              after a linear is bf16 as in bf16, but GPT-2's gelu_new: pow runs in fp32, so it keeps an fp32 cast
//              of c_fc's output, tanh and 1 + tanh in fp32, 0.5·x in bf16 and c_proj's bf16 cast of the product.
//              Gemma 2 (transformers models/gemma2/modeling_gemma2.py): input_layernorm and
//              pre_feedforward_layernorm read the fp32 stream as Llama's norms do; post_attention_layernorm and
//              post_feedforward_layernorm read o_proj's and down_proj's bf16 outputs and keep what they keep at
//              e = 2 (the fp32 copy, rstd, the fp32 normalised tensor, 1 + weight), casting their output back to
//              bf16 (type_as), which the residual add promotes to fp32; the soft-cap's tanh runs in bf16 (on
//              neither of CUDA autocast's lists) and the masked scores in fp32 (the mask has the stream's dtype).
//              Autocast's bf16 weight casts are the strategy's (strategies/ddp.cpp), not the block's.
#pragma once

#include <functional>
#include <initializer_list>
#include <string_view>

#include "emu/device.h"
#include "emu/ops.h"
#include "workloads/model/config.h"
#include "workloads/model/layout.h"
#include "workloads/model/tensor.h"

namespace emu::model {

class TensorParallel;  // tensor_parallel.h

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
  // Backward calls it with a parameter's offset in the layout once it has made that parameter's gradient (model.h
  // Hooks::gradient_made); empty: nobody listens.
  std::function<void(size_t offset)> gradient_made;
  // Tensor parallelism (tensor_parallel.h): the block's shapes are one rank's slice, and the partial sums of the
  // row-parallel outputs (forward) and of the column-parallel inputs' gradients (backward) are all-reduced here.
  TensorParallel* tp = nullptr;
  // The forward runs again in backward (activation checkpointing): GPT-2's stops once c_proj's input is saved again
  // and returns no output (torch.utils.checkpoint's early stop).
  bool recomputing = false;

  Buffer allocate(size_t count, DType dtype, Category category, std::string_view what) const;
  // Charged exactly as allocate() charges it, with no memory behind it: a tensor the framework holds that emu's math
  // never reads or writes (gelu_new's intermediates), so no time goes to zero-filling it.
  Buffer hold(size_t count, DType dtype, Category category, std::string_view what) const;
  // A per-row statistic (∝ T or b·a·s, scaling by k): charged at full scale ÷ k² (shrink.h, allocate_per_row).
  Buffer allocate_per_row(size_t count, DType dtype, Category category, std::string_view what) const;
  // Tells gradient_made that the gradients of the parameters at these offsets are made.
  void made(std::initializer_list<size_t> offsets) const;
  // Σ of `partial` over the TP group, in place (Megatron's g in forward, f in backward); nothing without TP.
  void tp_all_reduce(Buffer& partial, std::string_view what) const;
  // Sequence parallelism (tensor_parallel.h): on, and the rows of the residual stream and of the norms this rank
  // holds, T/t (T without it).
  bool sequence_parallel() const;
  int64_t rows() const;
};

// The tensors a block saves for backward; unused ones stay unallocated. Buffers marked (held) are charged as the
// framework holds them; emu's math reads the others.
struct BlockSaved {
  Buffer x;               // [T, h] block input (Llama at e = 2: released when the block ends, unless checkpointed)
  Buffer x32;             // Llama at e = 2: [T, h] fp32 copy of the block input, input_layernorm's saved input
  Buffer norm1_stats;     // [T] rstd (Llama) or [2, T] mean then rstd (GPT-2), fp32
  Buffer norm1_hat;       // Llama: [T, h] the normalised input at the compute dtype, Gemma's in fp32 (held)
  Buffer norm1_plus_one;  // Gemma: [h] fp32 (1 + weight), saved by the multiply (held)
  Buffer xn1;             // [T, h] first norm's output (under autocast, q_proj's or c_attn's bf16 cast of it)
  Buffer xn1_casts;       // autocast, Llama: [2, T, h] k_proj's and v_proj's casts of it (held)
  Buffer q, k, v;         // Llama: q [T, h], k and v [T, kvd] after rotary embedding ([T, h] when repeat_kv copies)
  Buffer qkv;             // GPT-2: [T, 3h], q | k | v column blocks
  Buffer probs;           // eager: [b, a, s, s] softmax output, fp32 (Llama) or the compute dtype (GPT-2)
  Buffer probs_copy;      // eager Llama at e = 2: [b, a, s, s] its .to(bf16) copy, what the PV product saves (held)
  Buffer lse;             // sdpa, flash: [b, a, s] fp32 (rows padded to 32 for sdpa in fp32)
  Buffer attn;            // [T, h] attention output, input of the output projection
  Buffer x2;              // [T, h] residual stream after attention (Llama at e = 2 without autocast: released when
                          // the block ends)
  Buffer x2_32;           // Llama at e = 2: [T, h] its fp32 copy, post_attention_layernorm's saved input
  Buffer norm2_stats;     // as norm1_stats
  Buffer norm2_hat;       // as norm1_hat (held)
  Buffer norm2_plus_one;  // as norm1_plus_one (held)
  Buffer xn2;             // [T, h] second norm's output (under autocast, gate_proj's or c_fc's bf16 cast of it)
  Buffer xn2_casts;       // autocast, Llama: [T, h] up_proj's cast of it (held)
  Buffer gate, up;        // Llama: [T, F] each
  Buffer silu;            // Llama: [T, F] silu(gate), saved by the product with up (held)
  Buffer fc;              // GPT-2: [T, F] pre-activation (under autocast its fp32 cast, saved by pow)
  Buffer gelu_tanh;       // GPT-2: [T, F] tanh(√(2/π)(x + 0.044715x³)) (held; fp32 under autocast)
  Buffer gelu_half;       // GPT-2: [T, F] 0.5·x (held)
  Buffer gelu_sum;        // GPT-2: [T, F] 1 + tanh(...) (held; fp32 under autocast)
  Buffer act;             // [T, F] input of the MLP's output projection
  Buffer softcap_tanh;    // eager Gemma 2: [b, a, s, s] tanh(scores / cap) at the compute dtype, tanh's saved output
  // Gemma 2's sandwich norms: the o_proj output (at e = 4; its fp32 copy at e = 2) and post_attention_layernorm's
  // saved tensors; the down_proj output and post_feedforward_layernorm's, alike.
  Buffer attn_o, attn_o32, norm3_stats, norm3_hat, norm3_plus_one;
  Buffer mlp_o, mlp_o32, norm4_stats, norm4_hat, norm4_plus_one;

  // Releases everything but the block input (what checkpointing keeps).
  void release_all_but_input();
};

// The weight an RMSNorm's math multiplies by: `w`, or for Gemma 1 + w, written into `scratch` (null when !math).
const float* norm_weight(Ops* ops, const ModelConfig& config, const float* w, Scratch& scratch);

// Runs the block on x (moved into saved.x) and returns its output [T, h], charged to `output_category`.
// `weights` is the unit's flat fp32 buffer (null when !env.math). `keep_input`: the caller holds the block input
// for backward (activation checkpointing keeps it); otherwise a Llama block at e = 2 releases it when it ends.
Buffer block_forward(const BlockEnv& env, const float* weights, Buffer x, BlockSaved& saved, Category saved_category,
                     Category output_category, bool keep_input);

// dres [T, h] fp32: on entry the gradient of the block output, on exit that of the block input. Accumulates the
// block's weight gradients into dweights (flat fp32, the unit's layout) and releases the saved tensors as soon as
// they are used for the last time.
void block_backward(const BlockEnv& env, const float* weights, BlockSaved& saved, float* dres, float* dweights);

}  // namespace emu::model
