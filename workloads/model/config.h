// The transformer's shapes: presets with the published shapes, Hugging Face config.json, and the shrink rule.
//
// Glossary (DESIGN.md §1): h hidden size, F FFN size, V vocabulary, s sequence length, L layers, a attention
// heads, kv key/value heads (grouped-query attention when kv < a), b micro-batch, k shrink factor.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "emu/dtype.h"

namespace emu::model {

enum class Style : uint8_t {
  kLlama,  // RMSNorm, rotary embedding (rotate_half), grouped-query attention, SwiGLU, no biases, untied head;
           // Mistral, Qwen2 (q/k/v biases), Phi-3 (fused projections) and Gemma too, as ModelConfig's flags say
  kGpt2,   // LayerNorm, learned positions, GELU (tanh approximation), biases, tied head
};
std::string_view style_name(Style style);
struct ModelConfig;
// The family as a user names it: "qwen2", "phi3", "gemma" or "gemma2" for the Llama-style variants, else
// style_name.
std::string_view family_name(const ModelConfig& config);

// Hugging Face's rope_scaling (Llama): how the rotary frequencies are stretched for a longer context.
struct RopeScaling {
  enum class Type : uint8_t {
    kNone,
    kLinear,    // every frequency / factor
    kDynamic,   // NTK: the base grows once the sequence passes the original context
    kLlama3,    // Llama 3.1: low frequencies / factor, high ones kept, a smooth ramp between
    kLongrope,  // Phi-3 128k, Phi-3.5: frequency j / short_factor[j] (s ≤ the original context) or long_factor[j]
  };
  Type type = Type::kNone;
  double factor = 1;
  double low_freq_factor = 1;          // llama3
  double high_freq_factor = 4;         // llama3
  int64_t original_max_positions = 0;  // the context the model was pre-trained at (llama3, dynamic, longrope)
  std::vector<double> short_factor;    // longrope: one per rotary frequency of the full-scale head (d/2)
  std::vector<double> long_factor;     // longrope: used once the full-scale s passes original_max_positions
  double attention_factor = 1;         // longrope: cos and sin are multiplied by it (the "attention scaling")
};

struct ModelConfig {
  std::string name;  // preset or file it came from, plus "/k" once shrunk
  Style style = Style::kLlama;
  int64_t hidden = 0;         // h
  int64_t ffn = 0;            // F
  int64_t vocab = 0;          // V
  int64_t seq = 0;            // s: tokens per sequence in a micro-batch
  int64_t max_positions = 0;  // rows of GPT-2's position table; the longest s a Llama preset was trained at
  int64_t layers = 0;         // L
  int64_t heads = 0;          // a
  int64_t kv_heads = 0;       // kv; a for multi-head attention
  int64_t batch = 1;          // b: sequences per micro-batch
  double norm_eps = 1e-5;
  double rope_theta = 10000;       // Llama only
  RopeScaling rope_scaling;        // Llama only
  int64_t sliding_window = 0;      // Mistral v0.1, Phi-3: each token attends to at most this many; 0 for full attention
  bool qkv_bias = false;           // Qwen2: q_proj, k_proj and v_proj carry biases (o_proj none)
  bool fused_projections = false;  // Phi-3: qkv_proj [h + 2·kvd, h] and gate_up_proj [2F, h] instead of separate ones
  bool gemma = false;  // Gemma: RMSNorm in fp32 times (1 + weight), embeddings × √h, GeGLU (gelu, tanh approximation)
  // Gemma 2 (transformers models/gemma2), on top of `gemma`:
  int64_t head_size = 0;        // head_dim when the config sets it apart from h/a (2304 / 8 heads of 256); 0: h/a
  double query_scale = 0;       // query_pre_attn_scalar: the scores are scaled by its −½ power; 0: by d^−½
  double attn_softcap = 0;      // attn_logit_softcapping: scores ← cap·tanh(scores / cap) before the mask; 0: none
  double final_softcap = 0;     // final_logit_softcapping: logits ← cap·tanh(logits / cap) before the loss; 0: none
  bool sandwich_norms = false;  // post_attention_layernorm on the attention output before the residual add, and
                                // pre_feedforward_layernorm / post_feedforward_layernorm around the MLP
  std::string seq_default;      // why s is what it is when no --seq-len was given (shown in the header)
  bool tie_embeddings = false;
  // Phi-3's partial_rotary_factor (Phi-4-mini: 0.75): the rotary embedding turns the first int(d·factor) dimensions
  // of each full-scale head (96 of 128), the others pass through unrotated.
  double partial_rotary = 1;
  int64_t shrink = 1;  // k this config was shrunk by (1: full scale)

  int64_t head_dim() const { return head_size != 0 ? head_size : hidden / heads; }
  int64_t q_dim() const { return heads * head_dim(); }  // columns of q and of the attention output: h but for Gemma 2
  int64_t kv_dim() const { return kv_heads * head_dim(); }
  // Dimensions of a head the rotary embedding turns: int(d·factor) at full scale (transformers' rotary dim); d when
  // the factor is 1. Shrunk by k: ÷ k, down to an even count and at least 2 (Phi-4-mini's 96 of 128 at k = 32: 2 of
  // 4), so that a partial embedding does not limit k beyond the head's own divisors; the rotary tables, a few KB at
  // full scale, are then the one term not exactly ÷ k².
  int64_t rotary_dim() const {
    if (partial_rotary == 1) return head_dim();
    const auto full = static_cast<int64_t>(static_cast<double>(head_dim() * shrink) * partial_rotary);
    return shrink == 1 ? full : std::min(head_dim(), 2 * std::max<int64_t>(1, full / (2 * shrink)));
  }
  int64_t tokens() const { return batch * seq; }  // T = b·s rows of every activation

  // InputError naming the bad field and value when the shapes are inconsistent (h not a multiple of a, a not a
  // multiple of kv, odd head dimension for rotary embedding, s above max_positions for GPT-2, ...).
  void validate() const;
};

// Presets with the published shapes; s defaults to the preset's context length and b to 1.
//   llama2-7b llama2-13b llama2-70b llama3-8b llama3-70b gpt2 gpt2-xl
std::vector<std::string> preset_names();
// InputError listing the known names when `name` is none of them.
ModelConfig preset(std::string_view name);

// The longest sequence a default run trains at without --seq-len: long-context models (Llama 3.1: 131072
// positions) are fine-tuned at their pre-training length, and the activations of 128k tokens fill any GPU.
inline constexpr int64_t kDefaultSeqCeiling = 8192;

// Shapes from a Hugging Face config.json, or from a snapshot folder holding one: Llama keys (hidden_size,
// intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, vocab_size,
// max_position_embeddings, rms_norm_eps, rope_theta, rope_scaling, hidden_act, attention_bias, mlp_bias,
// tie_word_embeddings; Mistral's sliding_window) or GPT-2 keys (n_embd, n_layer, n_head, n_positions, vocab_size,
// layer_norm_epsilon, n_inner, activation_function, scale_attn_weights, ...). The family comes from model_type
// ("llama", "mistral", "gpt2"), else from which keys are present. The default s is the pre-training context:
// max_position_embeddings, or rope_scaling's original_max_position_embeddings, at most the sliding window and
// kDefaultSeqCeiling. InputError naming the file, the key and the bad value for a missing, mistyped or
// out-of-range entry, and for every key whose value changes the math in a way emu does not compute (never a
// silent default); mixture-of-experts and other families are refused by name.
ModelConfig load_hf_config(const std::filesystem::path& path);

}  // namespace emu::model

namespace emu::model {

// Attention as Hugging Face's attn_implementation runs it (transformers models/llama/modeling_llama.py,
// integrations/sdpa_attention.py, integrations/flash_attention.py); blocks.h lists what each saves.
enum class Attention : uint8_t {
  kEager,  // eager_attention_forward: the score matrix materialised; its softmax saved for backward
  kSdpa,   // torch scaled_dot_product_attention (transformers' default): output and one logsumexp per row saved;
           // backward recomputes the probabilities. On a GPU bf16 runs the flash kernel, fp32 the memory-efficient
           // one, whose logsumexp rows are padded to a multiple of 32
  kFlash,  // flash_attention_2: as SDPA's flash kernel, logsumexp [b, a, s] fp32
};
std::string_view attention_name(Attention attention);
// The names attention_name gives, for messages listing the choices.
std::vector<std::string> attention_names();

// How the loss is computed from the final hidden states.
enum class Loss : uint8_t {
  kTrainer,  // Hugging Face's ForCausalLMLoss as the Trainer calls it (transformers loss/loss_utils.py): logits at
             // the compute dtype, their fp32 upcast (logits.float()), cross_entropy's fp32 log-softmax saved
  kFused,    // one fp32 [T, V] buffer that the loss turns into its own gradient, as fused/chunked cross-entropy
             // kernels (e.g. Liger's, torchtune's chunked loss) do
};
std::string_view loss_name(Loss loss);
std::vector<std::string> loss_names();

// How the model runs; independent of the shapes.
struct ModelOptions {
  DType compute = DType::kBF16;  // weights, gradients and activations: kBF16 (mixed, pure bf16) or kF32 (fp32)
  Attention attention = Attention::kSdpa;
  bool checkpoint = false;  // activation checkpointing per block: save the block input, recompute in backward
  Loss loss = Loss::kTrainer;
  // torch.autocast(compute) over fp32 parameters, PyTorch DDP's mixed recipe (the Trainer's bf16=True without
  // DeepSpeed): the residual stream, the norms and what they save stay fp32, each linear saves its own cast of
  // its input at the compute dtype (blocks.h lists the tensors). Only with compute below fp32.
  bool autocast = false;
  // Megatron-LM's --recompute-granularity selective (Korthikanti et al. 2022, §5): the core attention (q·kᵀ, softmax,
  // attention over v) is not saved but run again in backward; what it saves (the softmax, or the logsumexp) exists
  // only while its backward runs. Its inputs q, k, v and its output (o_proj's input) stay saved. Without checkpoint.
  bool selective_recompute = false;
  // Megatron-LM's --sequence-parallel, under tensor parallelism only (tensor_parallel.h): the norms and the
  // residual stream run on the rank's 1/t of the rows, each all-reduce becomes a reduce-scatter and an all-gather.
  bool sequence_parallel = false;

  // Bytes per element of the residual stream (the embedding output, each block's input and output): fp32 under
  // autocast, else the compute dtype.
  DType residual() const { return autocast ? DType::kF32 : compute; }
};

}  // namespace emu::model
