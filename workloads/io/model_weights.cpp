// Model weights under Hugging Face names: the name, shape and dtype checks between layout.h and a safetensors file.
#include "workloads/io/model_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <span>
#include <string_view>

#include "emu/bf16.h"
#include "emu/check.h"
#include "workloads/io/safetensors.h"
#include "workloads/model/layout.h"

namespace emu::io {
namespace {

// At most this many names are listed in one message.
constexpr size_t kListedNames = 5;

[[noreturn]] void fail(std::string_view source, std::string_view problem) {
  throw InputError(fmt::format("weights file {}: {}", source, problem));
}

// The prefix of the base model's parameters, which Hugging Face accepts present or absent when loading.
std::string_view base_prefix(model::Style style) { return style == model::Style::kGpt2 ? "transformer." : "model."; }

std::string describe(const model::ModelConfig& config) {
  return fmt::format("model {} ({} style, {} layers)", config.name.empty() ? "(unnamed)" : config.name,
                     model::style_name(config.style), config.layers);
}

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// "\"a\", \"b\", \"c\" and 4 more"
template <typename Names>
std::string name_list(const Names& names) {
  std::string text;
  size_t listed = 0;
  for (const auto& name : names) {
    if (listed == kListedNames) break;
    text += fmt::format("{}\"{}\"", listed == 0 ? "" : ", ", name);
    ++listed;
  }
  if (names.size() > listed) text += fmt::format(" and {} more", names.size() - listed);
  return text;
}

// `name` without `prefix` when it starts with it, else `name` unchanged.
std::string_view strip(std::string_view name, std::string_view prefix) {
  return name.starts_with(prefix) ? name.substr(prefix.size()) : name;
}

// True when `name` is head + N + tail for a decimal layer index N < layers.
bool is_layer_name(std::string_view name, std::string_view head, std::string_view tail, int64_t layers) {
  if (!name.starts_with(head) || !name.ends_with(tail) || name.size() <= head.size() + tail.size()) return false;
  const std::string_view digits = name.substr(head.size(), name.size() - head.size() - tail.size());
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  int64_t layer = 0;
  for (char c : digits) layer = layer * 10 + (c - '0');
  return layer < layers;
}

// A tensor Hugging Face checkpoints may hold that is not a parameter here, and that its own loader ignores too:
// the duplicate of a tied head, GPT-2's causal-mask buffers, older Llama checkpoints' rotary frequencies.
bool is_known_extra(std::string_view name, const model::ModelConfig& config) {
  const bool tied = config.style == model::Style::kGpt2 || config.tie_embeddings;
  if (tied && name == "lm_head.weight") return true;
  const std::string_view rest = strip(name, base_prefix(config.style));
  if (config.style == model::Style::kGpt2) {
    return is_layer_name(rest, "h.", ".attn.bias", config.layers) ||
           is_layer_name(rest, "h.", ".attn.masked_bias", config.layers);
  }
  return is_layer_name(rest, "layers.", ".self_attn.rotary_emb.inv_freq", config.layers);
}

// The file's tensor for parameter `name`, under that name or without the base prefix; its name in the file.
struct Found {
  std::string_view name;
  const SafetensorsTensor* tensor = nullptr;
};

Found find_parameter(const SafetensorsFile& file, std::string_view name, std::string_view prefix) {
  const auto full = file.tensors.find(name);
  const std::string_view short_name = strip(name, prefix);
  const auto bare = short_name.size() < name.size() ? file.tensors.find(short_name) : file.tensors.end();
  if (full != file.tensors.end() && bare != file.tensors.end()) {
    fail(file.source, fmt::format("holds both \"{}\" and \"{}\", the same parameter with and without the \"{}\" "
                                  "prefix; keep one",
                                  full->first, bare->first, prefix));
  }
  if (full != file.tensors.end()) return {full->first, &full->second};
  if (bare != file.tensors.end()) return {bare->first, &bare->second};
  return {};
}

// Checks the tensor found for `param` and widens it into `out` ([param.count] fp32).
void read_parameter(const SafetensorsFile& file, const Found& found, const model::ModelConfig& config,
                    const model::ParamInfo& param, float* out) {
  const SafetensorsTensor& tensor = *found.tensor;
  if (tensor.shape != param.shape) {
    std::vector<int64_t> reversed(param.shape.rbegin(), param.shape.rend());
    const bool transposed = config.style == model::Style::kGpt2 && param.shape.size() == 2 && tensor.shape == reversed;
    fail(file.source, fmt::format("tensor \"{}\" has shape {}, but {} expects {}{}", found.name,
                                  shape_text(tensor.shape), describe(config), shape_text(param.shape),
                                  transposed ? " (transposed: GPT-2's Conv1D weights are stored [in, out])" : ""));
  }
  const SafetensorsDType dtype = tensor.dtype;
  if (dtype != SafetensorsDType::kF32 && dtype != SafetensorsDType::kBF16 && dtype != SafetensorsDType::kF16) {
    fail(file.source, fmt::format("tensor \"{}\" has dtype {}; weights must be F32, BF16 or F16", found.name,
                                  safetensors_dtype_name(dtype)));
  }
  const std::vector<float> values = tensor.to_float();
  EMU_CHECK(values.size() == param.count, "tensor {} of shape {} gave {} values", found.name, shape_text(param.shape),
            values.size());
  if (!values.empty()) std::memcpy(out, values.data(), values.size() * sizeof(float));
}

// InputError when some of the model's parameters are not in the file; when none are, the file's own names hint
// at what it holds instead.
void check_missing(const SafetensorsFile& file, const model::ModelConfig& config,
                   const std::vector<std::string>& missing, size_t expected) {
  if (missing.empty()) return;
  std::string problem =
      fmt::format("lacks {} of the {} tensors of {} (with or without the \"{}\" prefix): {}", missing.size(), expected,
                  describe(config), base_prefix(config.style), name_list(missing));
  if (missing.size() == expected && !file.tensors.empty()) {
    std::vector<std::string_view> held;
    for (const auto& entry : file.tensors) held.push_back(entry.first);
    problem += fmt::format("; it holds {}: is it a checkpoint of another model or style?", name_list(held));
  }
  fail(file.source, problem);
}

}  // namespace

void save_model_weights(const std::filesystem::path& path, const model::ModelConfig& config,
                        const std::vector<std::vector<float>>& unit_values, DType dtype,
                        const WeightsMetadata& metadata) {
  const std::vector<model::UnitLayout> layouts = model::build_layouts(config);
  EMU_CHECK(unit_values.size() == layouts.size(), "{} unit buffers for the {} units of {}", unit_values.size(),
            layouts.size(), describe(config));
  for (size_t u = 0; u < layouts.size(); ++u) {
    EMU_CHECK(unit_values[u].size() == layouts[u].count, "unit {} ({}) has {} values, its layout {}", u,
              layouts[u].name, unit_values[u].size(), layouts[u].count);
  }

  // bf16 bit patterns of every unit, [units][unit count]; empty for fp32, whose values are written in place.
  std::vector<std::vector<uint16_t>> rounded;
  if (dtype == DType::kBF16) {
    rounded.resize(layouts.size());
    for (size_t u = 0; u < layouts.size(); ++u) {
      rounded[u].resize(unit_values[u].size());
      std::transform(unit_values[u].begin(), unit_values[u].end(), rounded[u].begin(), float_to_bf16);
    }
  }
  const SafetensorsDType stored = dtype == DType::kBF16 ? SafetensorsDType::kBF16 : SafetensorsDType::kF32;

  std::vector<TensorView> views;
  for (size_t u = 0; u < layouts.size(); ++u) {
    const std::span<const std::byte> unit_bytes = dtype == DType::kBF16
                                                      ? tensor_bytes(std::span<const uint16_t>(rounded[u]))
                                                      : tensor_bytes(std::span<const float>(unit_values[u]));
    const size_t element_size = dtype_size(dtype);
    for (const model::ParamInfo& p : layouts[u].params) {
      views.push_back({p.name, stored, p.shape, unit_bytes.subspan(p.offset * element_size, p.count * element_size)});
    }
  }

  WeightsMetadata with_format = metadata;
  with_format.emplace("format", "pt");  // Hugging Face's loader rejects a file without it; a given one is kept
  write_safetensors(path, views, with_format);
}

std::vector<std::vector<float>> load_model_weights(const std::filesystem::path& path,
                                                   const model::ModelConfig& config) {
  const SafetensorsFile file = read_safetensors(path);
  const std::vector<model::UnitLayout> layouts = model::build_layouts(config);
  const std::string_view prefix = base_prefix(config.style);

  std::vector<std::vector<float>> values(layouts.size());  // [units][unit count]
  std::set<std::string_view> used;                         // file names matched to a parameter
  std::vector<std::string> missing;
  size_t expected = 0;
  for (size_t u = 0; u < layouts.size(); ++u) {
    values[u].resize(layouts[u].count);
    for (const model::ParamInfo& p : layouts[u].params) {
      ++expected;
      const Found found = find_parameter(file, p.name, prefix);
      if (found.tensor == nullptr) {
        missing.push_back(p.name);
        continue;
      }
      read_parameter(file, found, config, p, values[u].data() + p.offset);
      used.insert(found.name);
    }
  }
  check_missing(file, config, missing, expected);

  std::vector<std::string_view> unexpected;
  for (const auto& entry : file.tensors) {
    if (!used.contains(entry.first) && !is_known_extra(entry.first, config)) unexpected.push_back(entry.first);
  }
  if (!unexpected.empty()) {
    fail(file.source, fmt::format("holds {} tensor{} that {} does not have: {}", unexpected.size(),
                                  unexpected.size() == 1 ? "" : "s", describe(config), name_list(unexpected)));
  }
  return values;
}

}  // namespace emu::io
