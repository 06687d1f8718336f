// emu computes the loss Hugging Face transformers computes, family by family: tiny configs of llama, qwen2, phi3 (also
// with longrope), gemma, gemma2 and gpt2, weights and tokens from closed formulas, and transformers' fp32 loss on them,
// recorded by scripts/oracle/hf_loss.py (versions in the fixture). emu reads each config through load_hf_config, fills
// every unit by the same formula under the Hugging Face names of its layout, and runs one forward pass on the CPU
// device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "emu/device.h"
#include "tests/support/paths.h"
#include "tests/support/process.h"
#include "workloads/model/config.h"
#include "workloads/model/layout.h"
#include "workloads/model/local_params.h"
#include "workloads/model/model.h"

namespace emu::model {
namespace {

using nlohmann::json;

// The fixture's weight formula (its "weights" entry).
float formula_value(const std::string& name, size_t index, size_t ndim) {
  unsigned sum = 0;
  for (const unsigned char ch : name) sum += ch;
  const double phase = double(sum % 1000) / 100.0;
  const double x = std::sin(0.731 * double(index) + phase);
  if (ndim >= 2) return float(0.2 * x);
  if (name.ends_with("bias")) return float(0.02 * x);
  return float(1.0 + 0.1 * x);
}

int32_t formula_token(int64_t i, int64_t vocab) { return int32_t((37 * i + 11) % vocab); }

float emu_loss(const ModelConfig& config) {
  auto device = make_cpu_device({});
  Model m(*device, config, {DType::kF32, Attention::kEager, false});
  std::vector<std::vector<float>> units;
  for (int u = 0; u < m.num_units(); ++u) {
    const UnitLayout& layout = m.layout(u);
    units.emplace_back(layout.count);
    for (const ParamInfo& p : layout.params) {
      for (size_t i = 0; i < p.count; ++i) units.back()[p.offset + i] = formula_value(p.name, i, p.shape.size());
    }
    m.bind_weights(u, units.back().data());
  }
  std::vector<int32_t> tokens, targets;
  for (int64_t i = 0; i < config.tokens(); ++i) {
    tokens.push_back(formula_token(i, config.vocab));
    targets.push_back(formula_token(i + 1, config.vocab));
  }
  NoHooks hooks;
  const float loss = m.forward(tokens.data(), targets.data(), hooks);
  m.discard();
  return loss;
}

TEST(HfLoss, EveryFamilyComputesTransformersLoss) {
  std::ifstream file(std::filesystem::path(EMU_SOURCE_DIR) / "tests/data/oracle/hf_loss.json");
  ASSERT_TRUE(file) << "tests/data/oracle/hf_loss.json";
  const json doc = json::parse(file);
  std::printf("recorded with torch %s, transformers %s\n", doc["versions"]["torch"].get<std::string>().c_str(),
              doc["versions"]["transformers"].get<std::string>().c_str());
  ASSERT_GE(doc["cases"].size(), 4u);
  const testing::TempDir dir("hf-loss");
  for (const json& c : doc["cases"]) {
    const std::string family = c["family"];
    const std::filesystem::path path = dir.file(family + ".json");
    std::ofstream(path) << c["config"].dump();
    ModelConfig config = load_hf_config(path);
    std::filesystem::remove(path);
    config.batch = doc["batch"];
    config.seq = doc["seq"];
    EXPECT_EQ(parameter_count(config), c["parameters"].get<uint64_t>()) << family;
    // fp32 on both sides; what remains is the order of the sums (measured: below 1e-6 relative).
    const double expected = c["loss"];
    EXPECT_NEAR(emu_loss(config), expected, 1e-5 * expected) << family;
  }
}

}  // namespace
}  // namespace emu::model
