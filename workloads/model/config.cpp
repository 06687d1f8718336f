#include "workloads/model/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "emu/check.h"

namespace emu::model {

std::string_view style_name(Style style) { return style == Style::kLlama ? "llama" : "gpt2"; }

std::string_view family_name(const ModelConfig& config) {
  if (config.qkv_bias) return "qwen2";
  if (config.fused_projections) return "phi3";
  if (config.sandwich_norms) return "gemma2";
  if (config.gemma) return "gemma";
  return style_name(config.style);
}

void ModelConfig::validate() const {
  auto require = [&](bool ok, std::string_view what, int64_t value, std::string_view accepted) {
    if (!ok) throw InputError(fmt::format("model {}: {} = {} is invalid; {}", name, what, value, accepted));
  };
  require(hidden >= 1, "hidden size h", hidden, "it must be at least 1");
  require(ffn >= 1, "FFN size F", ffn, "it must be at least 1");
  require(vocab >= 1, "vocabulary V", vocab, "it must be at least 1");
  require(seq >= 1, "sequence length s", seq, "it must be at least 1");
  require(layers >= 1, "layers L", layers, "it must be at least 1");
  require(batch >= 1, "micro-batch b", batch, "it must be at least 1");
  require(heads >= 1 && (head_size != 0 || hidden % heads == 0), "attention heads a", heads,
          fmt::format("it must divide the hidden size h = {}", hidden));
  require(head_size >= 0, "head dimension", head_size, "it must be positive");
  require(kv_heads >= 1 && heads % kv_heads == 0, "key/value heads", kv_heads,
          fmt::format("it must divide the attention heads a = {}", heads));
  if (style == Style::kLlama) {
    require(head_dim() % 2 == 0, head_size != 0 ? "head dimension head_dim" : "head dimension h/a", head_dim(),
            "rotary embedding pairs dimensions, so it must be even");
    require(rotary_dim() >= 2 && rotary_dim() % 2 == 0, "rotary dimension int(head_dim·partial_rotary_factor)",
            rotary_dim(), "rotary embedding pairs dimensions, so it must be even and at least 2");
    require(
        sliding_window == 0 || seq <= sliding_window, "sequence length s", seq,
        fmt::format("sliding-window attention is not modelled, so s must be at most the window, {}", sliding_window));
  } else {
    require(max_positions >= seq, "position table rows (n_positions)", max_positions,
            fmt::format("GPT-2 needs one learned position per token, at least s = {}", seq));
  }
  if (!(norm_eps > 0)) throw InputError(fmt::format("model {}: norm epsilon {} must be positive", name, norm_eps));
}

namespace {

ModelConfig llama(std::string name, int64_t h, int64_t f, int64_t v, int64_t s, int64_t layers, int64_t heads,
                  int64_t kv, double theta) {
  ModelConfig c;
  c.name = std::move(name);
  c.style = Style::kLlama;
  c.hidden = h;
  c.ffn = f;
  c.vocab = v;
  c.seq = s;
  c.max_positions = s;
  c.layers = layers;
  c.heads = heads;
  c.kv_heads = kv;
  c.norm_eps = 1e-5;
  c.rope_theta = theta;
  c.tie_embeddings = false;
  return c;
}

ModelConfig gpt2(std::string name, int64_t h, int64_t layers, int64_t heads) {
  ModelConfig c;
  c.name = std::move(name);
  c.style = Style::kGpt2;
  c.hidden = h;
  c.ffn = 4 * h;
  c.vocab = 50257;
  c.seq = 1024;
  c.max_positions = 1024;
  c.layers = layers;
  c.heads = heads;
  c.kv_heads = heads;
  c.norm_eps = 1e-5;
  c.tie_embeddings = true;
  return c;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "gpt2", "gpt2-xl"};
}

ModelConfig preset(std::string_view name) {
  // Shapes as published in the models' Hugging Face config.json files.
  if (name == "llama2-7b") return llama("llama2-7b", 4096, 11008, 32000, 4096, 32, 32, 32, 10000);
  if (name == "llama2-13b") return llama("llama2-13b", 5120, 13824, 32000, 4096, 40, 40, 40, 10000);
  if (name == "llama2-70b") return llama("llama2-70b", 8192, 28672, 32000, 4096, 80, 64, 8, 10000);
  if (name == "llama3-8b") return llama("llama3-8b", 4096, 14336, 128256, 8192, 32, 32, 8, 500000);
  if (name == "llama3-70b") return llama("llama3-70b", 8192, 28672, 128256, 8192, 80, 64, 8, 500000);
  if (name == "gpt2") return gpt2("gpt2", 768, 12, 12);
  if (name == "gpt2-xl") return gpt2("gpt2-xl", 1600, 48, 25);
  throw InputError(fmt::format("unknown model preset '{}'; known presets: {}", name, fmt::join(preset_names(), ", ")));
}

}  // namespace emu::model

namespace emu::model {
std::string_view attention_name(Attention attention) {
  switch (attention) {
    case Attention::kEager: return "eager";
    case Attention::kSdpa: return "sdpa";
    case Attention::kFlash: return "flash";
  }
  return "?";
}
std::vector<std::string> attention_names() { return {"sdpa", "eager", "flash"}; }

std::string_view loss_name(Loss loss) { return loss == Loss::kTrainer ? "trainer" : "fused"; }
std::vector<std::string> loss_names() { return {"trainer", "fused"}; }
}  // namespace emu::model
