// Shapes from a Hugging Face config.json (LlamaConfig or GPT2Config keys).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "emu/check.h"
#include "workloads/model/config.h"

namespace emu::model {
namespace {

using nlohmann::json;

class Reader {
 public:
  Reader(const std::filesystem::path& path, json root) : path_(path), root_(std::move(root)) {}

  bool has(const char* key) const { return root_.contains(key) && !root_[key].is_null(); }

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

ModelConfig read_llama(const Reader& r, const std::filesystem::path& path) {
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
  c.seq = c.max_positions;
  c.norm_eps = r.positive_number_or("rms_norm_eps", 1e-6);
  c.rope_theta = r.positive_number_or("rope_theta", 10000);
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", false);
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
  c.seq = c.max_positions;
  c.ffn = r.positive_int_or("n_inner", 4 * c.hidden);  // null or absent: 4h, as GPT2Config documents
  c.norm_eps = r.positive_number_or("layer_norm_epsilon", 1e-5);
  c.tie_embeddings = r.boolean_or("tie_word_embeddings", true);
  if (!c.tie_embeddings) {
    throw InputError(
        fmt::format("{}: key \"tie_word_embeddings\" is false; emu's GPT-2 style always ties the head", path.string()));
  }
  return c;
}

}  // namespace

ModelConfig load_hf_config(const std::filesystem::path& path) {
  std::ifstream file(path);
  if (!file) throw InputError(fmt::format("{}: cannot open the model config file", path.string()));
  json root;
  try {
    root = json::parse(file);
  } catch (const json::exception& error) {  // parse_error, and out_of_range for numbers such as 1e400
    throw InputError(fmt::format("{}: not valid JSON: {}", path.string(), error.what()));
  }
  if (!root.is_object()) throw InputError(fmt::format("{}: expected a JSON object at the top level", path.string()));
  const Reader reader(path, root);

  const std::string type = reader.string_or("model_type", reader.has("n_embd") ? "gpt2" : "llama");
  ModelConfig config;
  if (type == "llama") {
    config = read_llama(reader, path);
  } else if (type == "gpt2") {
    config = read_gpt2(reader, path);
  } else {
    throw InputError(
        fmt::format("{}: key \"model_type\" is \"{}\"; expected \"llama\" or \"gpt2\"", path.string(), type));
  }
  config.validate();
  return config;
}

}  // namespace emu::model
