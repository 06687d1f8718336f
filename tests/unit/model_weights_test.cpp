// Model weights as safetensors under Hugging Face names: F32 round trips exactly and BF16 to nearest even, a
// saved and reloaded model computes the same loss bit for bit, Hugging Face's own naming variants load (GPT-2 names
// without "transformer.", its mask buffers, a tied head's duplicate, Llama's rotary buffers), and every bad file is
// an InputError naming the file and the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "emu/bf16.h"
#include "emu/check.h"
#include "emu/device.h"
#include "emu/dtype.h"
#include "tests/support/tiny_model.h"
#include "workloads/io/model_weights.h"
#include "workloads/io/safetensors.h"
#include "workloads/model/layout.h"
#include "workloads/model/local_params.h"
#include "workloads/model/model.h"
#include "workloads/model/tensor.h"

namespace emu::io {
namespace {

namespace fs = std::filesystem;
using model::ModelConfig;
using model::Style;
using Units = std::vector<std::vector<float>>;  // [units][unit count] fp32

ModelConfig tiny(Style style, bool tied) {
  ModelConfig c = test::smallest_config(style);
  c.tie_embeddings = tied;
  return c;
}

// Random values in every unit (norm weights near 1, biases non-zero), large enough to give a loss well away from
// log V and with plenty of bits below bf16's precision.
Units random_units(const ModelConfig& config, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  Units units;
  for (const model::UnitLayout& layout : model::build_layouts(config)) {
    std::vector<float>& values = units.emplace_back(layout.count);
    for (const model::ParamInfo& p : layout.params) {
      for (size_t i = 0; i < p.count; ++i)
        values[p.offset + i] = (p.init == model::Init::kOnes ? 1.0f : 0.0f) + normal(rng);
    }
  }
  return units;
}

// A tensor with its own bytes, for building files as another tool would.
struct Owned {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

Owned f32_tensor(std::string name, std::vector<int64_t> shape, const float* values) {
  size_t count = 1;
  for (int64_t d : shape) count *= size_t(d);
  Owned t{std::move(name), SafetensorsDType::kF32, std::move(shape), std::vector<std::byte>(count * 4)};
  if (count != 0) std::memcpy(t.bytes.data(), values, count * 4);
  return t;
}

// Every parameter of `units` as an F32 tensor under its layout.h name, with `prefix` removed where it begins it.
std::vector<Owned> parameter_tensors(const ModelConfig& config, const Units& units, const std::string& prefix = "") {
  std::vector<Owned> tensors;
  const auto layouts = model::build_layouts(config);
  for (size_t u = 0; u < layouts.size(); ++u) {
    for (const model::ParamInfo& p : layouts[u].params) {
      std::string name = p.name;
      if (!prefix.empty() && name.starts_with(prefix)) name = name.substr(prefix.size());
      tensors.push_back(f32_tensor(name, p.shape, units[u].data() + p.offset));
    }
  }
  return tensors;
}

void write_owned(const fs::path& path, const std::vector<Owned>& tensors) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const Owned& t : tensors) views.push_back({t.name, t.dtype, t.shape, t.bytes});
  write_safetensors(path, views);
}

Owned* find(std::vector<Owned>& tensors, const std::string& name) {
  for (Owned& t : tensors) {
    if (t.name == name) return &t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return nullptr;
}

// The mean loss of one forward pass of `config`'s model with fp32 `units` rounded to `compute` and bound.
float forward_loss(const ModelConfig& config, const Units& units, DType compute) {
  auto device = make_cpu_device({});
  model::Model m(*device, config, {compute, model::Attention::kEager, false});
  std::vector<std::vector<uint16_t>> bf16(units.size());
  for (int u = 0; u < m.num_units(); ++u) {
    const std::vector<float>& values = units[size_t(u)];
    if (compute == DType::kF32) {
      m.bind_weights(u, values.data());
    } else {
      bf16[size_t(u)].resize(values.size());
      model::narrow(values.data(), DType::kBF16, values.size(), bf16[size_t(u)].data());
      m.bind_weights(u, bf16[size_t(u)].data());
    }
  }
  std::mt19937 rng(17);
  std::vector<int32_t> tokens, targets;
  for (int64_t i = 0; i < config.tokens(); ++i) {
    tokens.push_back(int32_t(rng() % uint32_t(config.vocab)));
    targets.push_back(int32_t(rng() % uint32_t(config.vocab)));
  }
  model::NoHooks hooks;
  const float loss = m.forward(tokens.data(), targets.data(), hooks);
  m.discard();
  return loss;
}

class ModelWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("emu_model_weights_test." + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

const ModelConfig kConfigs[] = {tiny(Style::kLlama, false), tiny(Style::kLlama, true), tiny(Style::kGpt2, true)};

TEST_F(ModelWeightsTest, F32RoundTripsExactlyUnderHuggingFaceNamesAndShapes) {
  for (const ModelConfig& config : kConfigs) {
    SCOPED_TRACE(config.name + (config.tie_embeddings ? " tied" : " untied"));
    const Units units = random_units(config, 1);
    const fs::path path = dir_ / "weights.safetensors";
    save_model_weights(path, config, units, DType::kF32, {{"step", "7"}});
    EXPECT_EQ(load_model_weights(path, config), units);

    // One F32 tensor per parameter, named and shaped as layout.h lists it; a tied head is only the embedding.
    const SafetensorsFile file = read_safetensors(path);
    EXPECT_EQ(file.metadata, (WeightsMetadata{{"format", "pt"}, {"step", "7"}}));
    size_t params = 0;
    for (const model::UnitLayout& layout : model::build_layouts(config)) {
      for (const model::ParamInfo& p : layout.params) {
        ++params;
        const SafetensorsTensor* t = file.find(p.name);
        ASSERT_NE(t, nullptr) << p.name;
        EXPECT_EQ(t->dtype, SafetensorsDType::kF32);
        EXPECT_EQ(t->shape, p.shape) << p.name;
      }
    }
    EXPECT_EQ(file.tensors.size(), params);
    const bool head_written = config.style == Style::kLlama && !config.tie_embeddings;
    EXPECT_EQ(file.find("lm_head.weight") != nullptr, head_written);
  }
  // GPT-2's Conv1D weights keep Hugging Face's [in, out] layout.
  const ModelConfig gpt2 = tiny(Style::kGpt2, true);
  const fs::path path = dir_ / "gpt2.safetensors";
  save_model_weights(path, gpt2, random_units(gpt2, 2), DType::kF32);
  EXPECT_EQ(read_safetensors(path).at("transformer.h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(read_safetensors(path).at("transformer.h.1.mlp.c_proj.weight").shape, (std::vector<int64_t>{16, 8}));
}

TEST_F(ModelWeightsTest, Bf16RoundsToNearestEven) {
  for (const ModelConfig& config : kConfigs) {
    SCOPED_TRACE(config.name);
    const Units units = random_units(config, 3);
    const fs::path path = dir_ / "weights.safetensors";
    save_model_weights(path, config, units, DType::kBF16, {{"format", "mine"}});
    const SafetensorsFile file = read_safetensors(path);
    EXPECT_EQ(file.metadata.at("format"), "mine") << "a given format is kept";
    for (const auto& [name, tensor] : file.tensors) EXPECT_EQ(tensor.dtype, SafetensorsDType::kBF16) << name;
    const Units loaded = load_model_weights(path, config);
    ASSERT_EQ(loaded.size(), units.size());
    size_t rounded = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      ASSERT_EQ(loaded[u].size(), units[u].size());
      for (size_t i = 0; i < units[u].size(); ++i) {
        ASSERT_EQ(loaded[u][i], round_to_bf16(units[u][i])) << "unit " << u << " element " << i;
        ASSERT_LE(std::abs(loaded[u][i] - units[u][i]), std::ldexp(std::abs(units[u][i]), -8));
        rounded += loaded[u][i] != units[u][i];
      }
    }
    EXPECT_GT(rounded, 0u) << "bf16 really rounds";
  }
}

TEST_F(ModelWeightsTest, ReloadedModelComputesTheSameLoss) {
  for (const ModelConfig& config : kConfigs) {
    SCOPED_TRACE(config.name);
    const Units units = random_units(config, 4);
    const fs::path path = dir_ / "weights.safetensors";
    // fp32 weights saved as F32: the same loss, bit for bit.
    const float before = forward_loss(config, units, DType::kF32);
    save_model_weights(path, config, units, DType::kF32);
    EXPECT_EQ(forward_loss(config, load_model_weights(path, config), DType::kF32), before);
    // A bf16 model saved as BF16 loses nothing either.
    const float before_bf16 = forward_loss(config, units, DType::kBF16);
    save_model_weights(path, config, units, DType::kBF16);
    EXPECT_EQ(forward_loss(config, load_model_weights(path, config), DType::kBF16), before_bf16);
    EXPECT_GT(std::abs(before - std::log(float(config.vocab))), 0.05f) << "the weights matter to the loss";
  }
}

// Weights held by a LocalParams (the single-device reference) save and load into a fresh one.
TEST_F(ModelWeightsTest, LocalParamsWeightsReloadIntoAFreshModel) {
  const ModelConfig config = tiny(Style::kGpt2, true);
  auto device = make_cpu_device({});
  model::Model first(*device, config, {DType::kF32, model::Attention::kEager, false});
  model::LocalParams params(first, 9);
  Units units;
  for (int u = 0; u < first.num_units(); ++u) {
    const float* w = params.weights(u).as<float>();
    units.emplace_back(w, w + first.layout(u).count);
  }
  const fs::path path = dir_ / "weights.safetensors";
  save_model_weights(path, config, units, DType::kF32);
  EXPECT_EQ(forward_loss(config, load_model_weights(path, config), DType::kF32),
            forward_loss(config, units, DType::kF32));
}

// As Hugging Face's gpt2 checkpoint names them: no "transformer." prefix, causal-mask buffers per layer, and here
// also a tied head's duplicate and an F16 tensor.
TEST_F(ModelWeightsTest, Gpt2NamesWithoutPrefixAndHuggingFaceBuffersLoad) {
  const ModelConfig config = tiny(Style::kGpt2, true);
  Units units = random_units(config, 5);
  std::vector<Owned> tensors = parameter_tensors(config, units, "transformer.");
  EXPECT_NE(find(tensors, "h.0.attn.c_attn.weight"), nullptr);
  EXPECT_NE(find(tensors, "wte.weight"), nullptr);

  // ln_f.bias as F16: 1, −2, 0.5, 0.25 repeated.
  const uint16_t halves[] = {0x3c00, 0xc000, 0x3800, 0x3400};
  const float as_float[] = {1.0f, -2.0f, 0.5f, 0.25f};
  Owned* bias = find(tensors, "ln_f.bias");
  bias->dtype = SafetensorsDType::kF16;
  bias->bytes.resize(size_t(config.hidden) * 2);
  const size_t bias_offset = model::build_layouts(config)[0].param("transformer.ln_f.bias").offset;
  for (int64_t i = 0; i < config.hidden; ++i) {
    std::memcpy(bias->bytes.data() + 2 * i, &halves[i % 4], 2);
    units[0][bias_offset + size_t(i)] = as_float[i % 4];
  }

  const std::vector<float> mask(36, 1.0f), scalar = {-1e4f};
  for (int layer = 0; layer < config.layers; ++layer) {
    tensors.push_back(f32_tensor("h." + std::to_string(layer) + ".attn.bias", {1, 1, 6, 6}, mask.data()));
    tensors.push_back(f32_tensor("h." + std::to_string(layer) + ".attn.masked_bias", {}, scalar.data()));
  }
  tensors.push_back(f32_tensor("lm_head.weight", {config.vocab, config.hidden}, units[0].data()));
  const fs::path path = dir_ / "gpt2.safetensors";
  write_owned(path, tensors);
  EXPECT_EQ(load_model_weights(path, config), units);

  // The prefixed buffers of a newer checkpoint are ignored as well.
  std::vector<Owned> prefixed = parameter_tensors(config, units);
  prefixed.push_back(f32_tensor("transformer.h.1.attn.bias", {1, 1, 6, 6}, mask.data()));
  write_owned(path, prefixed);
  EXPECT_EQ(load_model_weights(path, config), units);
}

// A tied Llama as a bare LlamaModel saves it (no "model." prefix), with older checkpoints' rotary buffers.
TEST_F(ModelWeightsTest, LlamaNamesWithoutPrefixAndRotaryBuffersLoad) {
  const ModelConfig config = tiny(Style::kLlama, true);
  const Units units = random_units(config, 6);
  std::vector<Owned> tensors = parameter_tensors(config, units, "model.");
  const std::vector<float> inv_freq(2, 0.5f);
  tensors.push_back(f32_tensor("layers.0.self_attn.rotary_emb.inv_freq", {2}, inv_freq.data()));
  tensors.push_back(f32_tensor("model.layers.1.self_attn.rotary_emb.inv_freq", {2}, inv_freq.data()));
  tensors.push_back(f32_tensor("lm_head.weight", {config.vocab, config.hidden}, units[0].data()));
  const fs::path path = dir_ / "llama.safetensors";
  write_owned(path, tensors);
  EXPECT_EQ(load_model_weights(path, config), units);
}

struct BadFile {
  std::string what;
  ModelConfig config;
  std::function<void(std::vector<Owned>&)> spoil;
  std::vector<std::string> message;  // substrings the InputError's message must hold
};

std::vector<BadFile> bad_files() {
  const ModelConfig gpt2 = tiny(Style::kGpt2, true), llama = tiny(Style::kLlama, false);
  const std::vector<float> zeros(4096, 0.0f);  // more than any added tensor holds
  auto remove = [](std::string name) {
    return [name](std::vector<Owned>& t) { std::erase_if(t, [&](const Owned& o) { return o.name == name; }); };
  };
  auto add = [zeros](const std::string& name, const std::vector<int64_t>& shape) {
    return [=](std::vector<Owned>& t) { t.push_back(f32_tensor(name, shape, zeros.data())); };
  };
  auto reshape = [](const std::string& name, const std::vector<int64_t>& shape) {
    return [=](std::vector<Owned>& t) {
      Owned* o = find(t, name);
      if (o != nullptr) o->shape = shape;
    };
  };
  return {
      {"missing tensor",
       gpt2,
       remove("transformer.h.1.mlp.c_fc.bias"),
       {"lacks 1 of the 28 tensors", "\"transformer.h.1.mlp.c_fc.bias\"", "tiny-gpt2"}},
      {"missing head of an untied Llama", llama, remove("lm_head.weight"), {"lacks 1 of the 21", "\"lm_head.weight\""}},
      {"many missing",
       llama,
       [](std::vector<Owned>& t) { t.resize(t.size() - 7); },
       {"lacks 7 of the 21", "and 2 more"}},
      {"transposed Conv1D weight",
       gpt2,
       reshape("transformer.h.0.attn.c_attn.weight", {24, 8}),
       {"\"transformer.h.0.attn.c_attn.weight\" has shape [24, 8]", "expects [8, 24]", "transposed"}},
      {"wrong vocabulary",
       llama,
       reshape("model.embed_tokens.weight", {8, 11}),
       {"\"model.embed_tokens.weight\" has shape [8, 11]", "expects [11, 8]"}},
      {"wrong rank",
       gpt2,
       reshape("transformer.ln_f.weight", {1, 8}),
       {"\"transformer.ln_f.weight\"", "[1, 8]", "[8]"}},
      {"integer dtype",
       llama,
       [](std::vector<Owned>& t) {
         Owned* o = find(t, "model.norm.weight");
         o->dtype = SafetensorsDType::kI64;
         o->bytes.resize(8 * 8);
       },
       {"\"model.norm.weight\" has dtype I64", "F32, BF16 or F16"}},
      {"unexpected tensor",
       gpt2,
       add("transformer.h.2.ln_1.weight", {8}),
       {"holds 1 tensor that", "\"transformer.h.2.ln_1.weight\""}},
      {"mask buffer of a layer the model lacks", gpt2, add("h.2.attn.bias", {1, 1, 6, 6}), {"\"h.2.attn.bias\""}},
      {"GPT-2 buffer in a Llama file", llama, add("model.layers.0.attn.bias", {2}), {"\"model.layers.0.attn.bias\""}},
      {"rotary buffer of a layer the model lacks",
       llama,
       add("model.layers.2.self_attn.rotary_emb.inv_freq", {2}),
       {"\"model.layers.2.self_attn.rotary_emb.inv_freq\""}},
      {"many unexpected",
       llama,
       [add](std::vector<Owned>& t) {
         for (int i = 0; i < 7; ++i) add("extra." + std::to_string(i), {2})(t);
       },
       {"holds 7 tensors that", "\"extra.0\"", "and 2 more"}},
      {"both with and without the prefix",
       gpt2,
       add("wte.weight", {11, 8}),
       {"holds both \"transformer.wte.weight\" and \"wte.weight\""}},
      {"a Llama file for a GPT-2 model",
       gpt2,
       [](std::vector<Owned>& t) {
         t = parameter_tensors(tiny(Style::kLlama, true), random_units(tiny(Style::kLlama, true), 1));
       },
       {"lacks 28 of the 28", "another model", "\"model.embed_tokens.weight\""}},
  };
}

TEST_F(ModelWeightsTest, BadFilesAreInputErrorsNamingFileAndTensor) {
  for (const BadFile& bad : bad_files()) {
    SCOPED_TRACE(bad.what);
    std::vector<Owned> tensors = parameter_tensors(bad.config, random_units(bad.config, 7));
    bad.spoil(tensors);
    const fs::path path = dir_ / "bad.safetensors";
    write_owned(path, tensors);
    try {
      load_model_weights(path, bad.config);
      ADD_FAILURE() << "no error";
    } catch (const InputError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(path.string()), std::string::npos) << message;
      for (const std::string& part : bad.message) EXPECT_NE(message.find(part), std::string::npos) << message;
    }
  }
}

TEST_F(ModelWeightsTest, UnreadableFilesAreInputErrors) {
  const ModelConfig config = tiny(Style::kLlama, false);
  EXPECT_THROW(load_model_weights(dir_ / "absent.safetensors", config), InputError);
  const fs::path garbage = dir_ / "garbage.safetensors";
  std::ofstream(garbage) << "not a safetensors file";
  EXPECT_THROW(load_model_weights(garbage, config), InputError);
  EXPECT_THROW(
      save_model_weights(dir_ / "no" / "such" / "dir.safetensors", config, random_units(config, 8), DType::kF32),
      InputError);
}

}  // namespace
}  // namespace emu::io
