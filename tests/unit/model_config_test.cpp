// Presets with the published parameter counts, the shrink rule and its report, and Hugging Face config.json files.
#include <gtest/gtest.h>
#include <cmath>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "emu/check.h"
#include "emu/device.h"
#include "tests/support/paths.h"
#include "tests/support/process.h"
#include "workloads/model/config.h"
#include "workloads/model/layout.h"
#include "workloads/model/local_params.h"
#include "workloads/model/memory_terms.h"
#include "workloads/model/model.h"
#include "workloads/model/rope.h"
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
    // Every dimension of llama2-13b at s = 1024 divides by 32, and the terms that scale by k only (norm weights,
    // RMSNorm's rstd rows) are charged at full scale / k²: nothing is left.
    if (t.name == "  norm weights, biases (charged / k)" || t.name == "parameters as charged" ||
        t.name == "saved activations per block") {
      EXPECT_EQ(t.deviation(32), 0) << t.name;
    }
    // On the wire the 2L + 1 = 81 norm weights of h = 5120 go at their shrunk size, (k - 1) = 31 times too much
    // of 13,015,864,320 parameters.
    if (t.name == "parameters on the wire (as held)") {
      EXPECT_NEAR(t.deviation(32), 31.0 * 81 * 5120 / 13015864320.0, 1e-12) << t.name;
    }
  }
  EXPECT_EQ(report.worst_memory_term().deviation(32), 0);
  EXPECT_NE(report.format().find("at most +0.000%"), std::string::npos) << report.format();
  const std::string gpt2 = shrink_report(preset("gpt2"), 8, {}).format();
  std::printf("%s", gpt2.c_str());
  EXPECT_NE(gpt2.find("vocabulary V                        50257         6282"), std::string::npos) << gpt2;
  // 50257 / 8 = 6282.125 rounds to 6282: the logits are 0.125 / 6282.125 = 0.002% short, and say so.
  EXPECT_NE(gpt2.find("at most -0.002% (logits (fp32))"), std::string::npos) << gpt2;
}

// Writes `text` to a file in this test process's temporary folder and returns its path.
std::filesystem::path write_file(const std::string& name, const std::string& text) {
  static const testing::TempDir dir("model-config");
  std::filesystem::path path = dir.file(name);
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

// Real config.json files as their model repositories publish them (tests/data/hf/README.md names each source),
// with the parameter counts the model cards and the safetensors index publish.
std::filesystem::path hf_file(const std::string& name) {
  return std::filesystem::path(EMU_SOURCE_DIR) / "tests/data/hf" / (name + ".json");
}

TEST(ModelHfConfig, RealConfigsGiveThePublishedParameterCounts) {
  struct Case {
    std::string file;
    uint64_t parameters;
    int64_t seq;  // the default sequence length
  };
  const std::vector<Case> cases = {
      {"llama-3.1-8b", 8'030'261'248, 8192},
      {"llama-3.2-1b", 1'235'814'400, 8192},
      {"llama-3.2-3b", 3'212'749'824, 8192},
      {"llama-2-7b", 6'738'415'616, 4096},
      {"tinyllama-1.1b", 1'100'048'384, 2048},
      {"smollm2-135m", 134'515'008, 8192},
      {"smollm2-1.7b", 1'711'376'384, 8192},
      {"mistral-7b-v0.1", 7'241'732'096, 4096},
      {"mistral-7b-v0.3", 7'248'023'552, 8192},
      {"gpt2", 124'439'808, 1024},
      {"gpt2-medium", 354'823'168, 1024},
      {"gpt2-xl", 1'557'611'200, 1024},
      // Qwen2-0.5B "0.49B", Qwen2.5-1.5B "1.54B" (model cards); Phi-3-mini-4k-instruct "3.8B"; all three as
      // transformers counts them on the meta device (scripts/oracle/README.md). Phi-3's 2047-token sliding window
      // bounds its default s, rounded down to 42 · 48 = 2016 so that every valid k (up to 48 = d/2) divides it.
      {"qwen2-0.5b", 494'032'768, 8192},
      {"qwen2.5-1.5b", 1'543'714'304, 8192},
      {"phi-3-mini-4k", 3'821'079'552, 2016},
      // Phi-3.5-mini-instruct: Phi-3-mini's shapes, 131072 positions by longrope over a 4096-token pre-training
      // context, its default s down to 85 · 48 = 4080 so that every valid k (up to 48) divides it.
      {"phi-3.5-mini", 3'821'079'552, 4080},
      // Phi-4-mini-instruct "3.8B": tied V·h = 200064·3072 + 32·(3072·5120 + 3072² + 2·8192·3072 + 8192·3072 + 2·3072)
      // + 3072, by hand; longrope over a 4096-token pre-training context, which every valid k (up to 64) divides.
      {"phi-4-mini", 3'836'021'760, 4096},
      {"gemma-2b", 2'506'172'416, 8192},
      // Gemma 2: the model cards' 2.6B, 9B and 27B, as transformers counts them on the meta device, and by hand:
      // V·h + L·(2·h·a·d + 2·h·kv·d + 3·h·F + 4h) + h with d = head_dim (2b: 256000·2304 + 26·77,865,984 + 2304).
      // Every other layer slides over 4096 tokens, which bounds the default s.
      {"gemma-2-2b-it", 2'614'341'888, 4096},
      {"gemma-2-9b", 9'241'705'984, 4096},
      {"gemma-2-27b", 27'227'128'320, 4096},
  };
  for (const Case& c : cases) {
    const ModelConfig config = load_hf_config(hf_file(c.file));
    EXPECT_EQ(parameter_count(config), c.parameters) << c.file;
    EXPECT_EQ(config.seq, c.seq) << c.file;
  }
}

TEST(ModelHfConfig, DefaultSequenceIsThePretrainingContextAndSaysWhy) {
  // Llama 3.1: 131072 positions through rope_scaling; pre-trained at 8192.
  EXPECT_EQ(load_hf_config(hf_file("llama-3.1-8b")).seq_default, "rope_scaling's original_max_position_embeddings");
  // Mistral v0.1: every token attends to 4096 others at most, which emu does not model beyond the window.
  EXPECT_EQ(load_hf_config(hf_file("mistral-7b-v0.1")).seq_default, "the sliding window");
  // Mistral v0.3: 32768 positions, no scaling, no window: the ceiling.
  EXPECT_EQ(load_hf_config(hf_file("mistral-7b-v0.3")).seq_default,
            "emu's default ceiling; the model takes up to 32768");
  ModelConfig mistral = load_hf_config(hf_file("mistral-7b-v0.1"));
  mistral.seq = 8192;
  EXPECT_THROW(mistral.validate(), InputError);
}

TEST(ModelHfConfig, SnapshotFolderIsReadThroughItsConfig) {
  const testing::TempDir dir("model-snapshot");
  const std::filesystem::path folder = dir.file("snapshot");
  std::filesystem::create_directories(folder);
  std::filesystem::copy_file(hf_file("tinyllama-1.1b"), folder / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(parameter_count(load_hf_config(folder)), 1'100'048'384ull);
  std::filesystem::remove(folder / "config.json");
  try {
    load_hf_config(folder);
    ADD_FAILURE() << "accepted a folder without config.json";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a folder without config.json"), std::string::npos) << e.what();
  }
  std::filesystem::remove(folder);
}

TEST(ModelHfConfig, FamiliesEmuDoesNotModelAreRefusedByName) {
  auto refusal = [](const std::string& file) {
    try {
      load_hf_config(hf_file(file));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal("mixtral-8x7b").find("mixture-of-experts is not modelled yet"), std::string::npos);
  // Gemma 3 and later: refused by name (gemma and gemma2 are modelled).
  const std::string gemma3 = write_file("gemma3.json", R"({"model_type": "gemma3_text", "hidden_size": 64})").string();
  try {
    load_hf_config(gemma3);
    ADD_FAILURE() << "accepted gemma3_text";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("(gemma and gemma2 are)"), std::string::npos) << e.what();
  }
}

// Qwen2 and Phi-3 as transformers builds them: Qwen2's q/k/v biases (o_proj none), Phi-3's fused projections with
// the parameter count of separate ones; what emu does not compute (partial rotary, longrope, dropout, a Qwen2
// sliding window shorter than s) is refused or bounds s.
// Gemma as transformers builds it: tied head, norms starting at zero (they scale by 1 + weight), head_dim from the
// config (GemmaConfig's default 256 when absent) only where it is hidden / heads.
TEST(ModelHfConfig, GemmaShapes) {
  const ModelConfig gemma = load_hf_config(hf_file("gemma-2b"));
  EXPECT_TRUE(gemma.gemma);
  EXPECT_EQ(family_name(gemma), "gemma");
  EXPECT_TRUE(gemma.tie_embeddings);
  EXPECT_EQ(gemma.head_dim(), 256);
  const std::vector<UnitLayout> units = build_layouts(gemma);
  EXPECT_EQ(units[1].param("model.layers.0.input_layernorm.weight").init, Init::kZeros);
  EXPECT_EQ(units[0].param("model.norm.weight").init, Init::kZeros);
  const std::string shape = R"("model_type": "gemma", "hidden_size": 3072, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 16, "vocab_size": 10, "max_position_embeddings": 64)";
  // Gemma-7B: head_dim 256 with 16 heads of a 3072 hidden size; and the same by GemmaConfig's default.
  expect_input_error("gemma7b.json", "{" + shape + R"(, "head_dim": 256})", R"(key "head_dim" is 256)");
  expect_input_error("gemma_default.json", "{" + shape + "}", R"(key "head_dim" is 256)");
  expect_input_error("gemma_act.json", "{" + shape + R"(, "head_dim": 192, "hidden_act": "silu"})",
                     R"(key "hidden_act" is "silu")");
  EXPECT_NO_THROW(
      load_hf_config(write_file("gemma_ok.json", "{" + shape + R"(, "head_dim": 192, "hidden_act": "gelu"})")));
}

// Gemma 2 as transformers builds it (models/gemma2): q_proj [a·d, h] and o_proj [h, a·d] with d = head_dim apart
// from h/a, four norms per block, query_pre_attn_scalar, both soft-caps, the window bounding s; sdpa refused by the
// app (transformers' Gemma2 has no SDPA path).
TEST(ModelHfConfig, Gemma2Shapes) {
  const ModelConfig g = load_hf_config(hf_file("gemma-2-27b"));
  EXPECT_EQ(family_name(g), "gemma2");
  EXPECT_EQ(g.head_dim(), 128);
  EXPECT_EQ(g.q_dim(), 4096);
  EXPECT_EQ(g.query_scale, 144);
  EXPECT_EQ(g.attn_softcap, 50);
  EXPECT_EQ(g.final_softcap, 30);
  EXPECT_EQ(g.sliding_window, 4096);
  const UnitLayout block = build_layouts(g)[1];
  const std::vector<int64_t> q = {4096, 4608}, o = {4608, 4096};
  EXPECT_EQ(block.param("model.layers.0.self_attn.q_proj.weight").shape, q);
  EXPECT_EQ(block.param("model.layers.0.self_attn.o_proj.weight").shape, o);
  EXPECT_EQ(block.param("model.layers.0.post_feedforward_layernorm.weight").init, Init::kZeros);
  EXPECT_EQ(block.param("model.layers.0.pre_feedforward_layernorm.weight").count, 4608u);
  // Shrinking divides head_dim and h alike (k = 4: d 32, h 1152) and keeps query_pre_attn_scalar's ratio to d.
  const ModelConfig small = shrink(g, 4);
  EXPECT_EQ(small.head_dim(), 32);
  EXPECT_EQ(small.hidden, 1152);
  EXPECT_EQ(small.query_scale, 36);
  // null soft-caps are none; a dropout or bidirectional attention is refused.
  const std::string shape = R"("model_type": "gemma2", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 24, "vocab_size": 10, "max_position_embeddings": 64)";
  const ModelConfig uncapped = load_hf_config(write_file(
      "gemma2_uncapped.json",
      "{" + shape + R"(, "attn_logit_softcapping": null, "final_logit_softcapping": null, "sliding_window": null})"));
  EXPECT_EQ(uncapped.attn_softcap, 0);
  EXPECT_EQ(uncapped.final_softcap, 0);
  EXPECT_EQ(uncapped.sliding_window, 0);
  expect_input_error("gemma2_dropout.json", "{" + shape + R"(, "attention_dropout": 0.1})", "dropout is not modelled");
}

TEST(ModelHfConfig, Qwen2AndPhi3Shapes) {
  const ModelConfig qwen = load_hf_config(hf_file("qwen2-0.5b"));
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_EQ(family_name(qwen), "qwen2");  // the run header's model line
  EXPECT_EQ(qwen.sliding_window, 0);      // use_sliding_window false
  const UnitLayout block = build_layouts(qwen)[1];
  EXPECT_EQ(block.param("model.layers.0.self_attn.q_proj.bias").count, 896u);
  EXPECT_EQ(block.param("model.layers.0.self_attn.k_proj.bias").count, 128u);  // 2 kv heads · 64
  for (const ParamInfo& p : block.params) EXPECT_EQ(p.name.find("o_proj.bias"), std::string::npos);

  ModelConfig phi = load_hf_config(hf_file("phi-3-mini-4k"));
  EXPECT_TRUE(phi.fused_projections);
  EXPECT_EQ(family_name(phi), "phi3");
  EXPECT_EQ(phi.sliding_window, 2047);
  const UnitLayout fused = build_layouts(phi)[1];
  const std::vector<int64_t> qkv = {3 * 3072, 3072}, gate_up = {2 * 8192, 3072};
  EXPECT_EQ(fused.param("model.layers.0.self_attn.qkv_proj.weight").shape, qkv);
  EXPECT_EQ(fused.param("model.layers.0.mlp.gate_up_proj.weight").shape, gate_up);
  // k starts h rows into qkv_proj, v h + kvd rows, up F rows into gate_up_proj ([out, in], 3072 columns).
  const LlamaBlockOffsets off = llama_block_offsets(phi, fused);
  EXPECT_EQ(off.k - off.q, 3072u * 3072u);
  EXPECT_EQ(off.v - off.q, 2u * 3072u * 3072u);
  EXPECT_EQ(off.up - off.gate, 8192u * 3072u);
  phi.seq = 2048;
  EXPECT_THROW(phi.validate(), InputError);

  const std::string shape = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
      "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 64)";
  // A partial rotary embedding turns int(d·factor) dimensions of each head (d = 16 here; Phi-4-mini: 0.75 of 128);
  // more than the head, or an odd count, is refused.
  const auto partial =
      write_file("partial_ok.json", R"({"model_type": "phi3", )" + shape + R"(, "partial_rotary_factor": 0.5})");
  EXPECT_EQ(load_hf_config(partial).rotary_dim(), 8);
  std::filesystem::remove(partial);
  expect_input_error("partial.json", R"({"model_type": "phi3", )" + shape + R"(, "partial_rotary_factor": 1.5})",
                     R"(key "partial_rotary_factor" is 1.5)");
  expect_input_error("partial_odd.json", R"({"model_type": "phi3", )" + shape + R"(, "partial_rotary_factor": 0.3125})",
                     "rotary dimension int(head_dim·partial_rotary_factor) = 5 is invalid");
  // Longrope needs one short and one long factor per rotary frequency (head dimension 16: 8 each).
  expect_input_error("longrope.json",
                     R"({"model_type": "phi3", )" + shape + R"(, "rope_scaling": {"type": "longrope", "factor": 32}})",
                     R"("short_factor" a list of 8 positive numbers)");
  expect_input_error("longrope_short.json",
                     R"({"model_type": "phi3", )" + shape +
                         R"(, "rope_scaling": {"type": "longrope", "short_factor": [1, 1], "long_factor": [1, 1]}})",
                     R"("short_factor" a list of 8 positive numbers)");
  expect_input_error("dropout.json", R"({"model_type": "phi3", )" + shape + R"(, "resid_pdrop": 0.1})",
                     "dropout is not modelled");
  // Qwen2 with use_sliding_window: layers from max_window_layers on slide; s is bounded by the window.
  const ModelConfig sliding = load_hf_config(write_file(
      "qwen_window.json", R"({"model_type": "qwen2", )" + shape +
                              R"(, "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 2})"));
  EXPECT_EQ(sliding.sliding_window, 16);
  EXPECT_EQ(sliding.seq, 16);
  EXPECT_EQ(
      load_hf_config(write_file("qwen_all_full.json",
                                R"({"model_type": "qwen2", )" + shape +
                                    R"(, "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 4})"))
          .sliding_window,
      0);
}

TEST(ModelHfConfig, KeysThatChangeTheMathAreComputedOrRefused) {
  const std::string shape = R"("model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 8)";
  expect_input_error("head_dim.json", "{" + shape + R"(, "head_dim": 32})", R"(key "head_dim" is 32; expected 16)");
  expect_input_error("act.json", "{" + shape + R"(, "hidden_act": "gelu"})", R"(key "hidden_act" is "gelu")");
  expect_input_error("bias.json", "{" + shape + R"(, "attention_bias": true})", "biases in attention");
  expect_input_error("mlp_bias.json", "{" + shape + R"(, "mlp_bias": true})", "biases in the MLP");
  expect_input_error("yarn.json", "{" + shape + R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})",
                     "others, such as yarn, are not modelled yet");
  const std::string gpt2 = R"("n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 8, "vocab_size": 10)";
  expect_input_error("gelu.json", "{" + gpt2 + R"(, "activation_function": "relu"})",
                     R"(key "activation_function" is "relu")");
  expect_input_error("scale.json", "{" + gpt2 + R"(, "scale_attn_weights": false})", "scale_attn_weights");
  expect_input_error("upcast.json", "{" + gpt2 + R"(, "reorder_and_upcast_attn": true})", "reorder_and_upcast_attn");
  // Values equal to what emu computes pass: Llama 3.2's explicit head_dim, GPT-2's exact-tanh GELU name.
  EXPECT_NO_THROW(load_hf_config(write_file("same.json", "{" + shape + R"(, "head_dim": 16})")));
  EXPECT_NO_THROW(
      load_hf_config(write_file("tanh.json", "{" + gpt2 + R"(, "activation_function": "gelu_pytorch_tanh"})")));
}

// transformers' modeling_rope_utils.py, by hand for head dimension 128, theta 500000: inv_freq_j = 500000^(−j/64).
TEST(ModelRope, Llama3ScalingStretchesOnlyTheLowFrequencies) {
  RopeScaling llama3;
  llama3.type = RopeScaling::Type::kLlama3;
  llama3.factor = 8;
  llama3.low_freq_factor = 1;
  llama3.high_freq_factor = 4;
  llama3.original_max_positions = 8192;
  const std::vector<double> f = rope_inverse_frequencies(128, 500000, llama3, 8192);
  ASSERT_EQ(f.size(), 64u);
  // j = 0: wavelength 2π, below 8192 / 4: kept.
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  // j = 32: 500000^(−1/2) = 1.4142136e-3, wavelength 4442.883 between 2048 and 8192: smooth =
  // (8192/4442.883 − 1)/3 = 0.2812826, so f = 1.4142136e-3 · ((1 − 0.2812826)/8 + 0.2812826) = 5.248462e-4.
  EXPECT_NEAR(f[32], 5.248462e-4, 1e-10);
  // j = 63: wavelength 2.56e6 above 8192: divided by 8: 500000^(−63/64) / 8 = 3.06893e-7.
  EXPECT_NEAR(f[63], std::pow(500000.0, -63.0 / 64.0) / 8, 1e-15);
  EXPECT_NEAR(f[63], 3.06893e-7, 1e-11);

  RopeScaling linear;
  linear.type = RopeScaling::Type::kLinear;
  linear.factor = 4;
  EXPECT_DOUBLE_EQ(rope_inverse_frequencies(128, 10000, linear, 4096)[1], std::pow(10000.0, -1.0 / 64.0) / 4);

  // Dynamic NTK: unchanged within the original context; beyond it the base grows to
  // theta · (factor · s / context − (factor − 1))^(d / (d − 2)).
  RopeScaling dynamic;
  dynamic.type = RopeScaling::Type::kDynamic;
  dynamic.factor = 2;
  dynamic.original_max_positions = 4096;
  EXPECT_DOUBLE_EQ(rope_inverse_frequencies(128, 10000, dynamic, 4096)[1], std::pow(10000.0, -1.0 / 64.0));
  const double base = 10000 * std::pow(2.0 * 8192 / 4096 - 1, 128.0 / 126.0);
  EXPECT_NEAR(rope_inverse_frequencies(128, 10000, dynamic, 8192)[1], std::pow(base, -1.0 / 64.0), 1e-15);
}

// Phi-3.5-mini's longrope, by hand from transformers' _compute_longrope_parameters: factor = 131072 / 4096 = 32,
// attention_factor = √(1 + ln 32 / ln 4096) = √(1 + 5/12) = 1.1902381; frequency j = 10000^(−2j/96) / short_factor[j]
// up to s = 4096 at full scale, / long_factor[j] beyond; a head shrunk by k keeps every k-th frequency.
TEST(ModelRope, LongropeDividesByTheShortOrLongFactorsAndScalesCosAndSin) {
  const ModelConfig phi = load_hf_config(hf_file("phi-3.5-mini"));
  const RopeScaling& rope = phi.rope_scaling;
  ASSERT_EQ(rope.type, RopeScaling::Type::kLongrope);
  EXPECT_EQ(rope.original_max_positions, 4096);
  EXPECT_NEAR(rope.attention_factor, 1.1902381, 1e-7);
  // short_factor[1] = 1.0199999809265137, long_factor[1] = 1.1100000143051147, long_factor[2] = 1.1399999856948853.
  const double f1 = std::pow(10000.0, -2.0 / 96.0);
  EXPECT_NEAR(rope_inverse_frequencies(96, 10000, rope, 4096)[1], f1 / 1.0199999809265137, 1e-15);
  EXPECT_NEAR(rope_inverse_frequencies(96, 10000, rope, 8192)[1], f1 / 1.1100000143051147, 1e-15);
  // k = 2: head dimension 48, frequency 1 is the full head's frequency 2.
  EXPECT_NEAR(rope_inverse_frequencies(48, 10000, rope, 8192)[1], std::pow(10000.0, -4.0 / 96.0) / 1.1399999856948853,
              1e-15);
  std::vector<float> cos(2), sin(2);
  rope_tables(1, {1.0, 0.5}, cos.data(), sin.data(), rope.attention_factor);
  EXPECT_FLOAT_EQ(cos[0], float(1.1902381));  // position 0: cos 1 and sin 0, times the factor
  EXPECT_FLOAT_EQ(sin[0], 0.0f);
}

}  // namespace
}  // namespace emu::model

namespace emu::model {
namespace {

// The training FLOPs of one micro-batch step, by hand from the shapes (Narayanan et al. 2021, §5.1): 6 FLOPs per
// token per weight of every matrix product (q, k, v, o and the MLP's matrices in each block, the LM head), plus
// 12·b·s²·a·d per block for the attention scores and their product with v (forward 4, backward 8).
double hand_step_flops(const ModelConfig& c) {
  const double h = double(c.hidden), F = double(c.ffn), ad = double(c.heads * c.head_dim());
  const double kvd = double(c.kv_heads * c.head_dim());
  const double block =
      c.style == Style::kGpt2 ? 3 * h * h + h * h + 2 * h * F : h * ad + 2 * h * kvd + ad * h + 3 * h * F;
  const double T = double(c.batch * c.seq), s = double(c.seq);
  return 6 * T * (double(c.layers) * block + double(c.vocab) * h) +
         12 * double(c.layers) * double(c.batch) * s * s * ad;
}

// No default run (no --shrink, no --seq-len) of an accepted real config computes more than the bound per step:
// 16 GFLOP per micro-batch (shrink.h says why), besides at most 4M parameters.
TEST(ModelDefaultShrink, BoundsEveryAcceptedConfigsComputeAndParameters) {
  int accepted = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(EMU_SOURCE_DIR) / "tests/data/hf")) {
    if (entry.path().extension() != ".json") continue;
    ModelConfig full;
    try {
      full = load_hf_config(entry.path());
    } catch (const InputError&) {
      continue;  // refused families: FamiliesEmuDoesNotModelAreRefusedByName
    }
    ++accepted;
    const int64_t k = default_shrink(full);
    const ModelConfig shrunk = shrink(full, k);
    EXPECT_LE(hand_step_flops(shrunk), 16e9) << entry.path() << " k = " << k;
    // Gemma-2-27B: its head dimension 128 allows k = 64 at most, which leaves 27.2e9 / 64² = 6.66M parameters.
    if (k != valid_shrink_factors(full).back()) {
      EXPECT_LE(parameter_count(shrunk), 4'000'000u) << entry.path();
    }
    EXPECT_LE(parameter_count(shrunk), 7'000'000u) << entry.path() << " k = " << k;
    EXPECT_DOUBLE_EQ(step_flops(shrunk), hand_step_flops(shrunk)) << entry.path();
  }
  EXPECT_GE(accepted, 12);
  // SmolLM2-135M (h 576, F 1536, V 49152, L 30, a 9, kv 3, s 8192): k = 8 leaves 2.1M parameters but h 72, F 192,
  // V 6144, s 1024: 6·1024·(30·(72² + 2·72·24 + 72² + 3·72·192) + 6144·72) + 12·30·1024²·72 = 40.1 GFLOP. k = 16:
  // 5.0 GFLOP.
  EXPECT_EQ(default_shrink(load_hf_config(hf_file("smollm2-135m"))), 16);
  EXPECT_NEAR(hand_step_flops(shrink(load_hf_config(hf_file("smollm2-135m")), 8)), 40.09e9, 0.01e9);
  // Llama 2 7B: the parameter bound decides (k = 32 leaves 6.6M parameters); its step at k = 64 is 0.72 GFLOP.
  EXPECT_EQ(default_shrink(load_hf_config(hf_file("llama-2-7b"))), 64);
}

}  // namespace
}  // namespace emu::model
