#include "workloads/model/layout.h"

#include <fmt/format.h>

#include <cmath>

#include "emu/check.h"

namespace emu::model {

const ParamInfo& UnitLayout::param(std::string_view param_name) const {
  for (const ParamInfo& p : params) {
    if (p.name == param_name) return p;
  }
  EMU_CHECK(false, "unit {} has no parameter {}", name, param_name);
  return params.front();
}

namespace {

class LayoutBuilder {
 public:
  explicit LayoutBuilder(std::string name) { layout_.name = std::move(name); }
  void add(std::string name, std::vector<int64_t> shape, Init init) {
    ParamInfo p;
    p.name = std::move(name);
    p.count = 1;
    for (int64_t d : shape) p.count *= static_cast<size_t>(d);
    p.shape = std::move(shape);
    p.offset = layout_.count;
    p.decay = p.shape.size() >= 2;
    p.init = init;
    layout_.count += p.count;
    layout_.params.push_back(std::move(p));
  }
  UnitLayout take() { return std::move(layout_); }

 private:
  UnitLayout layout_;
};

// Gemma's RMSNorm scales by (1 + weight) and starts its weights at zero (transformers GemmaRMSNorm).
Init norm_init(const ModelConfig& c) { return c.gemma ? Init::kZeros : Init::kOnes; }

UnitLayout llama_root(const ModelConfig& c) {
  LayoutBuilder b("root");
  b.add("model.embed_tokens.weight", {c.vocab, c.hidden}, Init::kNormal);
  b.add("model.norm.weight", {c.hidden}, norm_init(c));
  if (!c.tie_embeddings) b.add("lm_head.weight", {c.vocab, c.hidden}, Init::kNormal);
  return b.take();
}

}  // namespace

bool gradient_made_at_end(const ModelConfig& config, size_t index) {
  if (config.style == Style::kGpt2) return index == kWte || index == kWpe;  // GPT-2's head is always wte
  return index == kEmbedTokens;
}

namespace {

UnitLayout llama_block(const ModelConfig& c, int64_t layer) {
  const std::string p = fmt::format("model.layers.{}.", layer);
  const int64_t h = c.hidden, f = c.ffn, kv = c.kv_dim(), qd = c.q_dim();
  LayoutBuilder b(fmt::format("block {}", layer + 1));
  if (c.fused_projections) {
    b.add(p + "self_attn.qkv_proj.weight", {qd + 2 * kv, h}, Init::kNormal);
  } else {
    b.add(p + "self_attn.q_proj.weight", {qd, h}, Init::kNormal);
    b.add(p + "self_attn.k_proj.weight", {kv, h}, Init::kNormal);
    b.add(p + "self_attn.v_proj.weight", {kv, h}, Init::kNormal);
  }
  b.add(p + "self_attn.o_proj.weight", {h, qd}, Init::kNormal);
  if (c.fused_projections) {
    b.add(p + "mlp.gate_up_proj.weight", {2 * f, h}, Init::kNormal);
  } else {
    b.add(p + "mlp.gate_proj.weight", {f, h}, Init::kNormal);
    b.add(p + "mlp.up_proj.weight", {f, h}, Init::kNormal);
  }
  b.add(p + "mlp.down_proj.weight", {h, f}, Init::kNormal);
  b.add(p + "input_layernorm.weight", {h}, norm_init(c));
  b.add(p + "post_attention_layernorm.weight", {h}, norm_init(c));
  if (c.sandwich_norms) {  // Gemma2DecoderLayer's registration order
    b.add(p + "pre_feedforward_layernorm.weight", {h}, norm_init(c));
    b.add(p + "post_feedforward_layernorm.weight", {h}, norm_init(c));
  }
  if (c.qkv_bias) {
    b.add(p + "self_attn.q_proj.bias", {qd}, Init::kZeros);
    b.add(p + "self_attn.k_proj.bias", {kv}, Init::kZeros);
    b.add(p + "self_attn.v_proj.bias", {kv}, Init::kZeros);
  }
  return b.take();
}

UnitLayout gpt2_root(const ModelConfig& c) {
  LayoutBuilder b("root");
  b.add("transformer.wte.weight", {c.vocab, c.hidden}, Init::kNormal);
  b.add("transformer.wpe.weight", {c.max_positions, c.hidden}, Init::kNormal);
  b.add("transformer.ln_f.weight", {c.hidden}, Init::kOnes);
  b.add("transformer.ln_f.bias", {c.hidden}, Init::kZeros);
  return b.take();
}

UnitLayout gpt2_block(const ModelConfig& c, int64_t layer) {
  const std::string p = fmt::format("transformer.h.{}.", layer);
  // qd = h, but a tensor-parallel rank's slice (tensor_parallel.h) holds a/t of the heads: qd = h/t.
  const int64_t h = c.hidden, f = c.ffn, qd = c.q_dim();
  LayoutBuilder b(fmt::format("block {}", layer + 1));
  b.add(p + "ln_1.weight", {h}, Init::kOnes);
  b.add(p + "ln_1.bias", {h}, Init::kZeros);
  b.add(p + "attn.c_attn.weight", {h, 3 * qd}, Init::kNormal);
  b.add(p + "attn.c_attn.bias", {3 * qd}, Init::kZeros);
  b.add(p + "attn.c_proj.weight", {qd, h}, Init::kNormal);
  b.add(p + "attn.c_proj.bias", {h}, Init::kZeros);
  b.add(p + "ln_2.weight", {h}, Init::kOnes);
  b.add(p + "ln_2.bias", {h}, Init::kZeros);
  b.add(p + "mlp.c_fc.weight", {h, f}, Init::kNormal);
  b.add(p + "mlp.c_fc.bias", {f}, Init::kZeros);
  b.add(p + "mlp.c_proj.weight", {f, h}, Init::kNormal);
  b.add(p + "mlp.c_proj.bias", {h}, Init::kZeros);
  return b.take();
}

// splitmix64: a counter-based generator, so any element's value can be drawn without drawing the ones before it.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A standard normal draw for element `index` of the stream `stream` (Box–Muller on two 32-bit uniforms).
float normal_at(uint64_t stream, uint64_t index) {
  const uint64_t bits = mix(stream ^ mix(index));
  const double u1 = (static_cast<double>(bits >> 32) + 0.5) / 4294967296.0;
  const double u2 = (static_cast<double>(bits & 0xffffffffu) + 0.5) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

std::vector<UnitLayout> build_layouts(const ModelConfig& config) {
  std::vector<UnitLayout> units;
  units.reserve(static_cast<size_t>(config.layers) + 1);
  const bool llama = config.style == Style::kLlama;
  units.push_back(llama ? llama_root(config) : gpt2_root(config));
  for (int64_t layer = 0; layer < config.layers; ++layer) {
    units.push_back(llama ? llama_block(config, layer) : gpt2_block(config, layer));
  }
  return units;
}

LlamaBlockOffsets llama_block_offsets(const ModelConfig& c, const UnitLayout& block) {
  const std::string p = block.params.front().name.substr(0, block.params.front().name.find("self_attn."));
  const size_t h = size_t(c.hidden), kv = size_t(c.kv_dim()), f = size_t(c.ffn), qd = size_t(c.q_dim());
  LlamaBlockOffsets o;
  if (c.fused_projections) {
    o.q = block.param(p + "self_attn.qkv_proj.weight").offset;
    o.k = o.q + qd * h;
    o.v = o.k + kv * h;
    o.gate = block.param(p + "mlp.gate_up_proj.weight").offset;
    o.up = o.gate + f * h;
  } else {
    o.q = block.param(p + "self_attn.q_proj.weight").offset;
    o.k = block.param(p + "self_attn.k_proj.weight").offset;
    o.v = block.param(p + "self_attn.v_proj.weight").offset;
    o.gate = block.param(p + "mlp.gate_proj.weight").offset;
    o.up = block.param(p + "mlp.up_proj.weight").offset;
  }
  o.o = block.param(p + "self_attn.o_proj.weight").offset;
  o.down = block.param(p + "mlp.down_proj.weight").offset;
  o.input_norm = block.param(p + "input_layernorm.weight").offset;
  o.post_norm = block.param(p + "post_attention_layernorm.weight").offset;
  o.sandwich = c.sandwich_norms;
  if (o.sandwich) {  // Gemma 2: the MLP's input norm is pre_feedforward_layernorm
    o.attn_out_norm = o.post_norm;
    o.post_norm = block.param(p + "pre_feedforward_layernorm.weight").offset;
    o.mlp_out_norm = block.param(p + "post_feedforward_layernorm.weight").offset;
  }
  o.bias = c.qkv_bias;
  if (o.bias) {
    o.q_bias = block.param(p + "self_attn.q_proj.bias").offset;
    o.k_bias = block.param(p + "self_attn.k_proj.bias").offset;
    o.v_bias = block.param(p + "self_attn.v_proj.bias").offset;
  }
  return o;
}

uint64_t parameter_count(const ModelConfig& config) {
  uint64_t total = 0;
  for (const UnitLayout& unit : build_layouts(config)) total += unit.count;
  return total;
}

void init_unit_range(const UnitLayout& layout, int unit, uint64_t seed, size_t begin, size_t count, float* out) {
  EMU_CHECK(begin <= layout.count && count <= layout.count - begin, "range [{}, +{}) of {} with {} elements", begin,
            count, layout.name, layout.count);
  const uint64_t stream = mix(seed * 0x100000001b3ull + static_cast<uint64_t>(unit));
  const size_t end = begin + count;
  for (const ParamInfo& p : layout.params) {
    const size_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.count);
    for (size_t i = lo; i < hi; ++i) {
      float value = 0;
      switch (p.init) {
        case Init::kNormal: value = 0.02f * normal_at(stream, i); break;
        case Init::kOnes: value = 1; break;
        case Init::kZeros: value = 0; break;
      }
      out[i - begin] = value;
    }
  }
}

}  // namespace emu::model
