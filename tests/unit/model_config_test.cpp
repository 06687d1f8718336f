// Presets with the published parameter counts, the shrink rule and its report, and Hugging Face config.json files.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "emu/check.h"
#include "emu/device.h"
#include "workloads/model/config.h"
#include "workloads/model/layout.h"
#include "workloads/model/local_params.h"
#include "workloads/model/memory_terms.h"
#include "workloads/model/model.h"
#include "workloads/model/shrink.h"

namespace emu::model {
namespace {

struct Published {
  const char* name;
  uint64_t parameters;
};
constexpr Published kPublished[] = {
    {"llama2-7b", 6'738'415'616ull}, {"llama2-13b", 13'015'864'320ull}, {"llama2-70b", 68'976'648'192ull},
    {"llama3-8b", 8'030'261'248ull}, {"llama3-70b", 70'553'706'496ull}, {"gpt2", 124'439'808ull},
    {"gpt2-xl", 1'557'611'200ull},
};

TEST(ModelPresets, ParameterCountsArePublished) {
  for (const Published& p : kPublished) EXPECT_EQ(parameter_count(preset(p.name)), p.parameters) << p.name;
}

// The same numbers from the allocator: a shapes-only device charges 2 bytes per bf16 parameter.
TEST(ModelPresets, ShapesOnlyDeviceChargesThePublishedCounts) {
  for (const Published& p : kPublished) {
    auto device = make_shapes_device({});
    Model model(*device, preset(p.name), {DType::kBF16, Attention::kEager, false});
    LocalParams params(model, 0);
    EXPECT_EQ(device->memory().in_use(Category::kParameters), 2 * p.parameters) << p.name;
    EXPECT_EQ(device->memory().in_use(Category::kGradients), 2 * p.parameters) << p.name;
  }
}

TEST(ModelPresets, HuggingFaceNamesAndShapes) {
  const std::vector<UnitLayout> llama = build_layouts(preset("llama2-70b"));
  ASSERT_EQ(llama.size(), 81u);
  EXPECT_EQ(llama[0].params[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(llama[0].param("lm_head.weight").shape, (std::vector<int64_t>{32000, 8192}));
  EXPECT_EQ(llama[80].param("model.layers.79.self_attn.k_proj.weight").shape, (std::vector<int64_t>{1024, 8192}));
  EXPECT_TRUE(llama[1].param("model.layers.0.mlp.down_proj.weight").decay);
  EXPECT_FALSE(llama[1].param("model.layers.0.input_layernorm.weight").decay);
  const std::vector<UnitLayout> gpt2 = build_layouts(preset("gpt2"));
  EXPECT_EQ(gpt2[0].params.size(), 4u) << "tied head: wte, wpe, ln_f weight and bias";
  EXPECT_EQ(gpt2[3].param("transformer.h.2.attn.c_attn.weight").shape, (std::vector<int64_t>{768, 2304}))
      << "Conv1D keeps Hugging Face's [in, out] layout";
  EXPECT_FALSE(gpt2[3].param("transformer.h.2.mlp.c_fc.bias").decay);
  size_t offset = 0;
  for (const ParamInfo& p : gpt2[5].params) {
    EXPECT_EQ(p.offset, offset) << p.name;
    offset += p.count;
  }
  EXPECT_EQ(offset, gpt2[5].count);
}

TEST(ModelPresets, UnknownNameListsTheKnownOnes) {
  try {
    preset("llama4");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("llama2-13b, llama2-70b"), std::string::npos) << e.what();
  }
}

TEST(ModelShrink, DividesWidthsKeepsDepth) {
  const ModelConfig s = shrink(preset("llama2-13b"), 32);
  EXPECT_EQ(s.hidden, 160);
  EXPECT_EQ(s.ffn, 432);
  EXPECT_EQ(s.vocab, 1000);
  EXPECT_EQ(s.seq, 128);
  EXPECT_EQ(s.layers, 40);
  EXPECT_EQ(s.heads, 40);
  EXPECT_EQ(s.kv_heads, 40);
  EXPECT_EQ(s.batch, 1);
  EXPECT_EQ(s.shrink, 32);
  const ModelConfig g = shrink(preset("gpt2"), 2);
  EXPECT_EQ(g.vocab, 25129) << "50257 / 2 rounds half up";
  EXPECT_EQ(g.max_positions, 512);
}

TEST(ModelShrink, RejectsAKThatBreaksTheHeadDimension) {
  EXPECT_EQ(valid_shrink_factors(preset("llama2-7b")), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64}))
      << "head dimension 128 must stay even for rotary embedding";
  EXPECT_EQ(valid_shrink_factors(preset("gpt2")), (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64}));
  for (int64_t k : {0, 3, 128}) {
    try {
      shrink(preset("llama2-7b"), k);
      FAIL() << k;
    } catch (const InputError& e) {
      const std::string text = e.what();
      EXPECT_NE(text.find("valid k: 1, 2, 4, 8, 16, 32, 64"), std::string::npos) << text;
      EXPECT_NE(text.find(fmt::format("k = {}", k)), std::string::npos) << text;
    }
  }
}

TEST(ModelShrink, ReportShowsEachTermsDeviation) {
  ModelConfig full = preset("llama2-13b");
  full.seq = 1024;
  const ShrinkReport report = shrink_report(full, 32, {DType::kBF16, Attention::kEager, false});
  std::printf("%s", report.format().c_str());
  for (const ShrinkTerm& t : report.terms) {
    if (t.name == "  block matrices" || t.name == "  embeddings, head, positions") {
      EXPECT_EQ(t.deviation(32), 0) << t.name;
    }
    if (t.name == "  norm weights and biases") {
      EXPECT_NEAR(t.deviation(32), 31, 1e-9) << "∝ h: shrinks by 1/k only";
    }
    if (t.name == "parameters (bytes at compute dtype)") {
      EXPECT_LT(std::abs(t.deviation(32)), 2e-3);
    }
    if (t.name == "saved activations per block") {
      EXPECT_LT(std::abs(t.deviation(32)), 5e-3);
    }
  }
  const std::string gpt2 = shrink_report(preset("gpt2"), 8, {}).format();
  std::printf("%s", gpt2.c_str());
  EXPECT_NE(gpt2.find("vocabulary V                        50257         6282"), std::string::npos) << gpt2;
}

// Writes `text` to a file in the test's temporary directory and returns its path.
std::filesystem::path write_file(const std::string& name, const std::string& text) {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("emu_model_test_" + name);
  std::ofstream(path) << text;
  return path;
}

TEST(ModelHfConfig, LlamaKeys) {
  const auto path = write_file("llama.json", R"({"model_type": "llama", "hidden_size": 8192,
      "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
      "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
      "tie_word_embeddings": false, "torch_dtype": "bfloat16"})");
  const ModelConfig c = load_hf_config(path);
  EXPECT_EQ(parameter_count(c), 70'553'706'496ull);
  EXPECT_EQ(c.kv_heads, 8);
  EXPECT_EQ(c.seq, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  std::filesystem::remove(path);
}

TEST(ModelHfConfig, Gpt2Keys) {
  const auto path = write_file("gpt2.json", R"({"model_type": "gpt2", "n_embd": 1600, "n_layer": 48, "n_head": 25,
      "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257, "layer_norm_epsilon": 1e-05, "n_inner": null})");
  const ModelConfig c = load_hf_config(path);
  EXPECT_EQ(c.style, Style::kGpt2);
  EXPECT_EQ(c.ffn, 6400);
  EXPECT_EQ(parameter_count(c), 1'557'611'200ull);
  std::filesystem::remove(path);
}

void expect_input_error(const std::string& name, const std::string& text, const std::string& expected) {
  const auto path = write_file(name, text);
  try {
    load_hf_config(path);
    ADD_FAILURE() << "accepted " << text;
  } catch (const InputError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
  std::filesystem::remove(path);
}

TEST(ModelHfConfig, BadFilesNameTheFileKeyAndValue) {
  expect_input_error("string.json", R"({"hidden_size": "4096"})", R"(key "hidden_size" is "4096")");
  expect_input_error("negative.json",
                     R"({"hidden_size": 64, "intermediate_size": -3, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 8})",
                     R"(key "intermediate_size" is -3; expected an integer from 1 to 1048576)");
  // Found by fuzzing: a size whose products overflow, and a number past double's range.
  expect_input_error("huge.json", R"({"n_embd": 9223372036854775807, "n_layer": 1, "n_head": 1, "n_positions": 1,
                                      "vocab_size": 1})",
                     R"(key "n_embd" is 9223372036854775807; expected an integer from 1 to 1048576)");
  expect_input_error("overflow.json", R"({"model_type": "llama", "hidden_size": 8, "rope_theta": 1e400})",
                     "not valid JSON");
  expect_input_error("missing.json", R"({"n_embd": 64, "n_layer": 2, "vocab_size": 10, "n_positions": 8})",
                     R"(required key "n_head" is missing)");
  expect_input_error("type.json", R"({"model_type": "bert"})", R"("model_type" is "bert")");
  expect_input_error("broken.json", R"({"hidden_size": )", "not valid JSON");
  expect_input_error("heads.json",
                     R"({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 6, "vocab_size": 10, "max_position_embeddings": 8})",
                     "attention heads a = 6");
  EXPECT_THROW(load_hf_config("/nonexistent/config.json"), InputError);
}

}  // namespace
}  // namespace emu::model
