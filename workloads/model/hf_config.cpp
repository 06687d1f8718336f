// Shapes from a Hugging Face config.json (LlamaConfig or GPT2Config keys).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "emu/check.h"
#include "workloads/model/config.h"
#include "workloads/model/shrink.h"

namespace emu::model {
namespace {

using nlohmann::json;

class Reader {
 public:
  Reader(const std::filesystem::path& path, json root) : path_(path), root_(std::move(root)) {}

  bool has(const char* key) const { return root_.contains(key) && !root_[key].is_null(); }
  bool is_null(const char* key) const { return root_.contains(key) && root_[key].is_null(); }
  const json& value(const char* key) const { return get(key); }

  // Shapes past 2^20 are no real model's, and keep every product of shapes inside 64 bits.
  static constexpr int64_t kMaxDimension = int64_t{1} << 20;
  int64_t positive_int(const char* key) const {
    const json& value = get(key);
    if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > kMaxDimension) {
      bad(key, value, fmt::format("an integer from 1 to {}", kMaxDimension));
    }
    return value.get<int64_t>();
  }
  int64_t positive_int_or(const char* key, int64_t fallback) const { return has(key) ? positive_int(key) : fallback; }
  double positive_number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const json& value = root_[key];
    if (!value.is_number() || !(value.get<double>() > 0)) bad(key, value, "a positive number");
    return value.get<double>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    const json& value = root_[key];
    if (!value.is_boolean()) bad(key, value, "true or false");
    return value.get<bool>();
  }
  std::string string_or(const char* key, std::string fallback) const {
    if (!has(key)) return fallback;
    const json& value = root_[key];
    if (!value.is_string()) bad(key, value, "a string");
    return value.get<std::string>();
  }

  [[noreturn]] void bad(const char* key, const json& value, std::string_view expected) const {
    throw InputError(fmt::format("{}: key \"{}\" is {}; expected {}", path_.string(), key, value.dump(), expected));
  }

 private:
  const json& get(const char* key) const {
    if (!root_.contains(key)) throw InputError(fmt::format("{}: required key \"{}\" is missing", path_.string(), key));
    return root_[key];
  }

  std::filesystem::path path_;
  json root_;
};

// Keys whose value changes the math: accepted only at a value emu computes, refused otherwise.
void require_value(const Reader& r, const char* key, const json& computed, std::string_view why) {
  if (r.has(key) && r.value(key) != computed) {
    r.bad(key, r.value(key), fmt::format("{} ({})", computed.dump(), why));
  }
}

// Longrope (transformers _compute_longrope_parameters; Phi3Config reads "su" as longrope): the context the model was
// pre-trained at is the top-level original_max_position_embeddings (Phi-3's place for it), else the rope_scaling
// entry of that name, else max_position_embeddings; factor defaults to max_position_embeddings over it, and
// attention_factor to √(1 + ln factor / ln original) (1 when factor ≤ 1).
void read_longrope(const Reader& r, const json& value, int64_t max_positions, int64_t head_dim, RopeScaling& scaling) {
  scaling.type = RopeScaling::Type::kLongrope;
  auto factors = [&](const char* key) {
    std::vector<double> out;
    const bool listed = value.contains(key) && value[key].is_array();
    if (listed) {
      for (const json& f : value[key]) {
        if (!f.is_number() || !(f.get<double>() > 0)) break;
        out.push_back(f.get<double>());
      }
    }
    if (!listed || out.size() != value[key].size() || out.size() != size_t(head_dim / 2)) {
      r.bad(
          "rope_scaling", value,
          fmt::format("\"{}\" a list of {} positive numbers, one per rotary frequency of a head (rotary dimension {})",
                      key, head_dim / 2, head_dim));
    }
    return out;
  };
  scaling.short_factor = factors("short_factor");
  scaling.long_factor = factors("long_factor");
  scaling.original_max_positions = max_positions;
  if (value.contains("original_max_position_embeddings")) {
    const json& original = value["original_max_position_embeddings"];
    if (!original.is_number_integer() || original.get<int64_t>() < 1) {
      r.bad("rope_scaling", value, "\"original_max_position_embeddings\" a positive integer");
    }
    scaling.original_max_positions = original.get<int64_t>();
  }
  scaling.original_max_positions =
      r.positive_int_or("original_max_position_embeddings", scaling.original_max_positions);
  const double factor =
      value.contains("factor") ? scaling.factor : double(max_positions) / double(scaling.original_max_positions);
  scaling.attention_factor =
      factor <= 1 ? 1 : std::sqrt(1 + std::log(factor) / std::log(double(scaling.original_max_positions)));
  if (value.contains("attention_factor")) {
    if (!value["attention_factor"].is_number() || !(value["attention_factor"].get<double>() > 0)) {
      r.bad("rope_scaling", value, "\"attention_factor\" a positive number");
    }
    scaling.attention_factor = value["attention_factor"].get<double>();
  }
}

RopeScaling read_rope_scaling(const Reader& r, int64_t max_positions, int64_t head_dim, const std::string& family) {
  RopeScaling scaling;
  if (!r.has("rope_scaling")) return scaling;
  const json& value = r.value("rope_scaling");
  auto number = [&](const char* key, double fallback) {
    if (!value.contains(key)) return fallback;
    if (!value[key].is_number() || !(value[key].get<double>() > 0))
      r.bad("rope_scaling", value, fmt::format("\"{}\" a positive number", key));
    return value[key].get<double>();
  };
  if (!value.is_object()) r.bad("rope_scaling", value, "null or an object with \"rope_type\"");
  const char* type_key = value.contains("rope_type") ? "rope_type" : "type";
  const std::string type =
      value.contains(type_key) && value[type_key].is_string() ? value[type_key].get<std::string>() : "";
  scaling.factor = number("factor", 1);
  scaling.original_max_positions = max_positions;
  if (type == "default") {
    scaling.type = RopeScaling::Type::kNone;
  } else if (type == "linear") {
    scaling.type = RopeScaling::Type::kLinear;
  } else if (type == "dynamic") {
    scaling.type = RopeScaling::Type::kDynamic;
  } else if (type == "llama3") {
    scaling.type = RopeScaling::Type::kLlama3;
    scaling.low_freq_factor = number("low_freq_factor", 1);
    scaling.high_freq_factor = number("high_freq_factor", 4);
    if (!(scaling.high_freq_factor > scaling.low_freq_factor)) {
      r.bad("rope_scaling", value, "high_freq_factor above low_freq_factor");
    }
    scaling.original_max_positions = static_cast<int64_t>(number("original_max_position_embeddings", 8192));
  } else if (type == "longrope" || (family == "phi3" && type == "su")) {
    read_longrope(r, value, max_positions, head_dim, scaling);
  } else {
    r.bad("rope_scaling", value,
          "rope_type \"default\", \"linear\", \"dynamic\", \"llama3\" or \"longrope\" (others, such as yarn, are "
          "not modelled yet)");
  }
  return scaling;
}

// The default s: the context the model was pre-trained at, at most the sliding window and kDefaultSeqCeiling.
void default_seq(ModelConfig& c) {
  c.seq = c.max_positions;
  c.seq_default = "max_position_embeddings";
  const bool pretrained_context =
      c.rope_scaling.type == RopeScaling::Type::kLlama3 || c.rope_scaling.type == RopeScaling::Type::kLongrope;
  if (pretrained_context && c.rope_scaling.original_max_positions < c.seq) {
    c.seq = c.rope_scaling.original_max_positions;
    c.seq_default = c.rope_scaling.type == RopeScaling::Type::kLlama3
                        ? "rope_scaling's original_max_position_embeddings"
                        : "original_max_position_embeddings, longrope's pre-training context";
  }
  if (c.sliding_window > 0 && c.sliding_window < c.seq) {
    c.seq = c.sliding_window;
    c.seq_default = "the sliding window";
  }
  if (c.seq > kDefaultSeqCeiling) {
    c.seq = kDefaultSeqCeiling;
    c.seq_default = fmt::format("emu's default ceiling; the model takes up to {}", c.max_positions);
  }
  // A multiple of every valid shrink factor, so that a shrunk run's s is exact (Phi-3's window of 2047 tokens would
  // otherwise round to 43 · 48 = 2064 at k = 48, 0.8% more activations; Phi-3.5's 4096 to 85 · 48 = 4080).
  int64_t multiple = 1;
  for (int64_t k : valid_shrink_factors(c)) multiple = std::lcm(multiple, k);
  if (c.seq % multiple != 0 && c.seq > multiple) {  // a shorter s stays: no multiple fits under it
    const int64_t given = c.seq;
    c.seq = c.seq / multiple * multiple;
    c.seq_default = fmt::format("{} ({}), down to a multiple of {} so that every shrink factor divides it",
                                c.seq_default, given, multiple);
  }
}

// Qwen2 (transformers models/qwen2): Llama with biases on q_proj, k_proj and v_proj. Its sliding window applies only
// with use_sliding_window, to the layers layer_types marks "sliding_attention" (by default those from
// max_window_layers on); where any layer has one, s is bounded by the window as for Mistral.
void read_qwen2(const Reader& r, ModelConfig& c) {
  c.qkv_bias = true;
  if (!r.boolean_or("use_sliding_window", false) || !r.has("sliding_window")) return;
  bool sliding = false;
  if (r.has("layer_types")) {
    const json& types = r.value("layer_types");
    if (!types.is_array()) r.bad("layer_types", types, "a list of \"full_attention\" or \"sliding_attention\"");
    for (const json& t : types) sliding = sliding || t == "sliding_attention";
  } else {
    sliding = r.positive_int_or("max_window_layers", 28) < c.layers;
  }
  if (sliding) c.sliding_window = r.positive_int("sliding_window");
}

// Phi-3 (transformers models/phi3): Llama's math with fused qkv_proj and gate_up_proj, a sliding window whenever
// sliding_window is set (Phi-3-mini-4k: 2047), residual and embedding dropout, and partial_rotary_factor (Phi-4-mini:
// 0.75, the rotary embedding over the first 96 of 128 dimensions of each head; read before the rope scaling, whose
// longrope factors are one per rotary frequency). Dropout is refused; longrope (the 128k variants, Phi-3.5,
// Phi-4-mini) is read by read_rope_scaling.
void read_phi3_rotary(const Reader& r, ModelConfig& c) {
  c.partial_rotary = r.positive_number_or("partial_rotary_factor", 1.0);
  if (c.partial_rotary > 1) r.bad("partial_rotary_factor", c.partial_rotary, "a fraction of a head in (0, 1]");
}

void read_phi3(const Reader& r, ModelConfig& c) {
  c.fused_projections = true;
  c.sliding_window = r.positive_int_or("sliding_window", 0);
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attention_dropout"}) {
    require_value(r, key, 0.0, "dropout is not modelled");
  }
}

// Gemma (transformers models/gemma): Llama's layout with a tied head, RMSNorm in fp32 times (1 + weight),
// embeddings × √h and GeGLU. Its head_dim (GemmaConfig's default 256 when absent) must be hidden / heads, as in
// Gemma-2B; Gemma-7B's 256 ≠ 3072 / 16 is refused. hidden_act "gelu" is read as the tanh approximation, as
// transformers does for the official releases.
void read_gemma(const Reader& r, ModelConfig& c) {
  c.gemma = true;
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", true);
  const int64_t head_dim = r.positive_int_or("head_dim", 256);
  if (c.head_size == 0 && head_dim * c.heads != c.hidden) {
    r.bad("head_dim", head_dim,
          fmt::format("hidden_size / num_attention_heads = {} / {} (Gemma's own head dimension is modelled for "
                      "gemma2 only)",
                      c.hidden, c.heads));
  }
  if (r.has("hidden_act") && r.value("hidden_act") != "gelu") {
    require_value(r, "hidden_act", "gelu_pytorch_tanh", "GeGLU with the tanh-approximated GELU is what emu computes");
  }
  require_value(r, "hidden_activation", "gelu_pytorch_tanh",
                "GeGLU with the tanh-approximated GELU is what emu computes");
}

// Gemma 2 (transformers models/gemma2, Gemma2Config's defaults where a key is absent): Gemma's norms, embedding
// scale, GeGLU and tied head, plus a head_dim of its own (256 for h = 2304 and 8 heads), scores scaled by
// query_pre_attn_scalar^−½, attention and final logits soft-capped (null: none), four norms per block, and a
// sliding window on every other layer (layer_types), which bounds s as Mistral's does: emu does not model a window
// shorter than the sequence.
void read_gemma2(const Reader& r, ModelConfig& c) {
  c.head_size = r.positive_int_or("head_dim", 256);
  c.query_scale = r.positive_number_or("query_pre_attn_scalar", 256);
  c.attn_softcap = r.is_null("attn_logit_softcapping") ? 0 : r.positive_number_or("attn_logit_softcapping", 50);
  c.final_softcap = r.is_null("final_logit_softcapping") ? 0 : r.positive_number_or("final_logit_softcapping", 30);
  c.sandwich_norms = true;
  c.sliding_window = r.is_null("sliding_window") ? 0 : r.positive_int_or("sliding_window", 4096);
  if (r.has("layer_types")) {
    const json& types = r.value("layer_types");
    bool sliding = false;
    if (!types.is_array()) r.bad("layer_types", types, "a list of \"full_attention\" or \"sliding_attention\"");
    for (const json& t : types) sliding = sliding || t == "sliding_attention";
    if (!sliding) c.sliding_window = 0;
  }
  require_value(r, "attention_dropout", 0.0, "dropout is not modelled");
  require_value(r, "use_bidirectional_attention", false, "emu computes causal attention");
}

ModelConfig read_llama(const Reader& r, const std::filesystem::path& path, const std::string& type) {
  ModelConfig c;
  c.name = path.string();
  c.style = Style::kLlama;
  c.hidden = r.positive_int("hidden_size");
  c.ffn = r.positive_int("intermediate_size");
  c.layers = r.positive_int("num_hidden_layers");
  c.heads = r.positive_int("num_attention_heads");
  c.kv_heads = r.positive_int_or("num_key_value_heads", c.heads);
  c.vocab = r.positive_int("vocab_size");
  c.max_positions = r.positive_int("max_position_embeddings");
  c.norm_eps = r.positive_number_or("rms_norm_eps", 1e-6);
  c.rope_theta = r.positive_number_or("rope_theta", 10000);
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
  if (type == "gemma2") {
    read_gemma2(r, c);
    read_gemma(r, c);
  } else if (type == "gemma") {
    read_gemma(r, c);
  } else {
    if (c.hidden % c.heads == 0) {
      require_value(r, "head_dim", c.hidden / c.heads,
                    "hidden_size / num_attention_heads; a head dimension of its own is not modelled yet");
    }
    require_value(r, "hidden_act", "silu", "SwiGLU with SiLU is the activation emu computes");
  }
  require_value(r, "attention_bias", false, "biases in attention are not modelled yet");
  require_value(r, "mlp_bias", false, "biases in the MLP are not modelled yet");
  require_value(r, "pretraining_tp", 1, "the tensor-parallel emulation of pre-training is not modelled");
  if (type == "phi3") read_phi3_rotary(r, c);
  c.rope_scaling = read_rope_scaling(r, c.max_positions, c.rotary_dim(), type);
  if (type == "mistral") c.sliding_window = r.positive_int_or("sliding_window", 0);
  if (type == "qwen2") read_qwen2(r, c);
  if (type == "phi3") read_phi3(r, c);
  default_seq(c);
  return c;
}

ModelConfig read_gpt2(const Reader& r, const std::filesystem::path& path) {
  ModelConfig c;
  c.name = path.string();
  c.style = Style::kGpt2;
  c.hidden = r.positive_int("n_embd");
  c.layers = r.positive_int("n_layer");
  c.heads = r.positive_int("n_head");
  c.kv_heads = c.heads;
  c.vocab = r.positive_int("vocab_size");
  c.max_positions = r.positive_int("n_positions");
  c.ffn = r.positive_int_or("n_inner", 4 * c.hidden);  // null or absent: 4h, as GPT2Config documents
  c.norm_eps = r.positive_number_or("layer_norm_epsilon", 1e-5);
  default_seq(c);
  if (r.has("activation_function") && r.value("activation_function") != "gelu_pytorch_tanh") {
    require_value(r, "activation_function", "gelu_new", "GELU with the tanh approximation is what emu computes");
  }
  require_value(r, "scale_attn_weights", true, "scores divided by the square root of the head dimension");
  require_value(r, "scale_attn_by_inverse_layer_idx", false, "per-layer score scaling is not modelled");
  require_value(r, "reorder_and_upcast_attn", false, "the fp32 attention of that option is not modelled");
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", true);
  if (!c.tie_embeddings) {
    throw InputError(
        fmt::format("{}: key \"tie_word_embeddings\" is false; emu's GPT-2 style always ties the head", path.string()));
  }
  return c;
}

// The model_type values emu computes.
constexpr std::string_view kAccepted = "llama, mistral, qwen2, phi3, gemma, gemma2, gpt2";

// Families that share a modelled family's math and shapes, and those refused with the reason.
bool is_mixture_of_experts(const Reader& r, const std::string& type) {
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size"}) {
    if (r.has(key)) return true;
  }
  return type.find("moe") != std::string::npos || type == "mixtral" || type == "dbrx" || type == "jamba" ||
         type.rfind("deepseek", 0) == 0;
}

std::string_view not_modelled_reason(const std::string& type) {
  if (type == "qwen3") return "its q/k norms are not modelled yet";
  if (type.rfind("gemma", 0) == 0) return "its architecture is not modelled yet (gemma and gemma2 are)";
  return {};
}

}  // namespace

ModelConfig load_hf_config(const std::filesystem::path& given) {
  // A snapshot folder (as from huggingface_hub's snapshot_download) holds its config.json.
  std::error_code error_code;
  const std::filesystem::path path = std::filesystem::is_directory(given, error_code) ? given / "config.json" : given;
  std::ifstream file(path);
  if (!file) {
    if (path != given) {
      throw InputError(
          fmt::format("{}: a folder without config.json; give a Hugging Face config.json or the "
                      "snapshot folder that holds one",
                      given.string()));
    }
    throw InputError(fmt::format("{}: cannot open the model config file", path.string()));
  }
  json root;
  try {
    root = json::parse(file);
  } catch (const json::exception& error) {  // parse_error, and out_of_range for numbers such as 1e400
    throw InputError(fmt::format("{}: not valid JSON: {}", path.string(), error.what()));
  }
  if (!root.is_object()) throw InputError(fmt::format("{}: expected a JSON object at the top level", path.string()));
  const Reader reader(path, root);

  const std::string type = reader.string_or("model_type", reader.has("n_embd") ? "gpt2" : "llama");
  if (is_mixture_of_experts(reader, type)) {
    throw InputError(
        fmt::format("{}: model_type \"{}\" is a mixture-of-experts model; mixture-of-experts is not "
                    "modelled yet (accepted: {})",
                    path.string(), type, kAccepted));
  }
  ModelConfig config;
  if (type == "llama" || type == "mistral" || type == "qwen2" || type == "phi3" || type == "gemma" ||
      type == "gemma2") {
    config = read_llama(reader, path, type);
  } else if (type == "gpt2") {
    config = read_gpt2(reader, path);
  } else if (const std::string_view why = not_modelled_reason(type); !why.empty()) {
    throw InputError(
        fmt::format("{}: model_type \"{}\" is not accepted: {} (accepted: {})", path.string(), type, why, kAccepted));
  } else {
    throw InputError(
        fmt::format("{}: key \"model_type\" is \"{}\"; expected one of {}", path.string(), type, kAccepted));
  }
  config.validate();
  return config;
}

}  // namespace emu::model
