// The model's parameters as units with flat layouts: what a strategy shards, gathers, reduces and updates.
//
// Unit 0 is the root: token embedding, GPT-2's position table, the final norm and the LM head (a tied head is the
// token embedding, listed once). Units 1..L are the transformer blocks, block i holding Hugging Face layer i − 1.
// Each unit's parameters lie back to back in one flat buffer, in the order listed, under their Hugging Face names
// and shapes, so a flat buffer can be filled from or written to a safetensors file name by name:
//   Linear (Llama)  [out, in]   y = x · Wᵀ
//   Conv1D (GPT-2)  [in, out]   y = x · W + b   (GPT-2's transposed layout, kept as Hugging Face stores it)
// Weight decay applies to every parameter with two or more dimensions (matrices and embeddings, nanoGPT's rule)
// and to none of the norm weights or biases.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "workloads/model/config.h"

namespace emu::model {

enum class Init : uint8_t {
  kNormal,  // N(0, 0.02²): matrices and embeddings
  kOnes,    // norm weights
  kZeros,   // biases
};

struct ParamInfo {
  std::string name;            // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // as Hugging Face stores it
  size_t offset = 0;           // first element within the unit's flat buffer
  size_t count = 0;            // elements
  bool decay = false;          // weight decay applies
  Init init = Init::kNormal;
};

struct UnitLayout {
  std::string name;  // "root" or "block 3"
  std::vector<ParamInfo> params;
  size_t count = 0;  // elements of the flat buffer

  // The parameter named `name`; checks that it exists.
  const ParamInfo& param(std::string_view name) const;
};

// Unit 0 (root) then units 1..L (blocks), for `config`'s shapes.
std::vector<UnitLayout> build_layouts(const ModelConfig& config);
// Ψ: elements of all units together.
uint64_t parameter_count(const ModelConfig& config);

// Deterministic initial values of elements [begin, begin + count) of `unit`'s flat buffer, as fp32, independent of
// how the unit is split: every element's value is a function of (seed, unit, element index) only, so any shard
// of any rank initialises to the same numbers as a single device would. N(0, 0.02²) for kNormal, 1 and 0 for
// kOnes and kZeros.
void init_unit_range(const UnitLayout& layout, int unit, uint64_t seed, size_t begin, size_t count, float* out);

}  // namespace emu::model

namespace emu::model {

// Where each weight of a Llama-style block starts in its unit's flat buffer, whatever tensors the family stores
// them in: Phi-3's qkv_proj [h + 2·kvd, h] holds q, k and v as consecutive row blocks of an [out, in] matrix, so
// each is an offset into it (transformers models/phi3/modeling_phi3.py slices its output the same way), and its
// gate_up_proj [2F, h] holds gate then up (chunk(2, dim=-1)). Biases (Qwen2's q, k, v) are absent otherwise.
struct LlamaBlockOffsets {
  // post_norm: the norm before the MLP (post_attention_layernorm; Gemma 2's pre_feedforward_layernorm)
  size_t q = 0, k = 0, v = 0, o = 0, gate = 0, up = 0, down = 0, input_norm = 0, post_norm = 0;
  bool sandwich = false;  // Gemma 2: norms on the attention output and the MLP output too
  size_t attn_out_norm = 0, mlp_out_norm = 0;
  bool bias = false;
  size_t q_bias = 0, k_bias = 0, v_bias = 0;
};
LlamaBlockOffsets llama_block_offsets(const ModelConfig& config, const UnitLayout& block);
enum Gpt2BlockParam : size_t {
  kLn1Weight,
  kLn1Bias,
  kAttnWeight,
  kAttnBias,
  kAttnProjWeight,
  kAttnProjBias,
  kLn2Weight,
  kLn2Bias,
  kFcWeight,
  kFcBias,
  kMlpProjWeight,
  kMlpProjBias,
};
// Positions of the root's parameters: Llama embed, norm, head (when untied); GPT-2 wte, wpe, ln_f weight and bias.
enum LlamaRootParam : size_t { kEmbedTokens, kFinalNorm, kLmHead };
enum Gpt2RootParam : size_t { kWte, kWpe, kLnFWeight, kLnFBias };
// Whether autograd makes root parameter `index`'s gradient at the end of backward, when it reaches the embeddings
// (Hooks::before_embedding_backward), rather than at its start with the LM head's: the token table, and GPT-2's
// positions. The final norm's (and an untied head's) is made at the head. A head tied to the table is a second use
// of it: autograd holds the head's part in the input buffer of the table's AccumulateGrad until the embedding's
// part comes, and makes the .grad from their sum only then (model.h Model::backward).
bool gradient_made_at_end(const ModelConfig& config, size_t index);

}  // namespace emu::model
