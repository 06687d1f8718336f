// The emu executable's own inputs: a token file to train on (--tokens) and weights to start from
// (--load-weights), with the bad versions of each as bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/emu_process.h"
#include "workloads/io/model_weights.h"
#include "workloads/model/config.h"
#include "workloads/model/layout.h"
#include "workloads/model/shrink.h"

namespace emu {
namespace {

using nlohmann::json;
using testing::mpiexec;
using testing::run_process;

using testing::kEmu;
using testing::read_json;

const std::string kRun = " --model gpt2 --shrink 8 --steps 2 --strategies ddp,zero3";
constexpr uint64_t kDefaultSeed = 1234;  // emu's --seed default

json run_json(const std::string& args, const testing::TempDir& dir, const std::string& name) {
  const std::string out = dir.file(name);
  const auto run = run_process(mpiexec(2) + kEmu + kRun + args + " --json " + out, 240);
  EXPECT_EQ(run.exit_code, 0) << args << "\n" << run.err;
  return read_json(out);
}

std::vector<float> losses(const json& root, size_t strategy) {
  return root["strategies"][strategy]["losses"].get<std::vector<float>>();
}

// DDP and ZeRO-3 train the same numbers, up to the order of their bf16 reductions.
void expect_same_training(const json& root) {
  const std::vector<float> ddp = losses(root, 0), zero3 = losses(root, 1);
  ASSERT_EQ(ddp.size(), zero3.size());
  for (size_t i = 0; i < ddp.size(); ++i) EXPECT_NEAR(zero3[i], ddp[i], 1e-4 * std::abs(ddp[i])) << "step " << i + 1;
}

// Every unit of `config` as the seeded initialisation makes it, written as model.safetensors.
void write_initial_weights(const model::ModelConfig& config, uint64_t seed, const std::string& path) {
  const std::vector<model::UnitLayout> layouts = model::build_layouts(config);
  std::vector<std::vector<float>> units;
  for (size_t u = 0; u < layouts.size(); ++u) {
    units.emplace_back(layouts[u].count);
    model::init_unit_range(layouts[u], int(u), seed, 0, layouts[u].count, units.back().data());
  }
  io::save_model_weights(path, config, units, DType::kF32);
}

TEST(Inputs, TrainingStartsFromTheLoadedWeights) {
  const testing::TempDir dir("inputs-weights");
  const model::ModelConfig run_model = model::shrink(model::preset("gpt2"), 8);
  write_initial_weights(run_model, kDefaultSeed, dir.file("same.safetensors"));
  write_initial_weights(run_model, 99, dir.file("other.safetensors"));

  const json seeded = run_json("", dir, "seeded.json");
  const json same = run_json(" --load-weights " + dir.file("same.safetensors"), dir, "same.json");
  const json other = run_json(" --load-weights " + dir.file("other.safetensors"), dir, "other.json");
  // The seeded initialisation, loaded from a file: the same numbers, bit for bit.
  EXPECT_EQ(losses(same, 0), losses(seeded, 0));
  EXPECT_EQ(losses(same, 1), losses(seeded, 1));
  // Other weights, the same data: another loss, and every strategy still trains the same numbers.
  EXPECT_NE(losses(other, 0), losses(seeded, 0));
  expect_same_training(other);
  EXPECT_EQ(other["config"]["initial_weights"], dir.file("other.safetensors"));
}

TEST(Inputs, WeightsOfOtherShapesAreBadInput) {
  const testing::TempDir dir("inputs-bad-weights");
  write_initial_weights(model::shrink(model::preset("gpt2"), 4), kDefaultSeed, dir.file("k4.safetensors"));
  const auto run = run_process(mpiexec(2) + kEmu + kRun + " --load-weights " + dir.file("k4.safetensors"), 120);
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_NE(run.err.find("shape"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("weights of the full-size model load with --shrink 1"), std::string::npos) << run.err;
  const auto missing = run_process(mpiexec(2) + kEmu + kRun + " --load-weights " + dir.file("none.safetensors"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("cannot be read: no such file"), std::string::npos) << missing.err;
}

TEST(Inputs, SavedWeightsAreTheTrainedOnes) {
  const testing::TempDir dir("inputs-save");
  const model::ModelConfig run_model = model::shrink(model::preset("gpt2"), 8);
  // fp32: in the mixed recipe DDP is autocast (fp32 weights and gradients) and ZeRO-3 DeepSpeed's bf16 weights with
  // an fp32 master, which round differently.
  const std::string common = " --model gpt2 --shrink 8 --steps 2 --precision fp32 --save-weights ";
  for (const std::string strategy : {"ddp", "zero3"}) {
    const auto run = run_process(
        mpiexec(2) + kEmu + common + dir.file(strategy + ".safetensors") + " --strategies " + strategy + ",zero2", 240);
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_NE(run.out.find(strategy + "'s weights after its last step to"), std::string::npos) << run.out;
  }
  write_initial_weights(run_model, kDefaultSeed, dir.file("initial.safetensors"));
  // emu's own loader reads them back under their Hugging Face names; DDP's and ZeRO-3's agree, and both moved.
  const auto ddp = io::load_model_weights(dir.file("ddp.safetensors"), run_model);
  const auto zero3 = io::load_model_weights(dir.file("zero3.safetensors"), run_model);
  const auto initial = io::load_model_weights(dir.file("initial.safetensors"), run_model);
  size_t moved = 0, total = 0;
  for (size_t u = 0; u < ddp.size(); ++u) {
    for (size_t i = 0; i < ddp[u].size(); ++i) {
      ASSERT_NEAR(zero3[u][i], ddp[u][i], 1e-5 + 1e-4 * std::abs(ddp[u][i])) << "unit " << u << " element " << i;
      moved += ddp[u][i] != initial[u][i] ? 1 : 0;
      ++total;
    }
  }
  EXPECT_GT(moved, total / 2) << "two AdamW steps change most weights";
}

// --steps 0 is set-up only: with --save-weights it writes the initial weights, which a user wants to start a
// framework from the same numbers; the file, the JSON and stderr say whose weights and after how many steps.
TEST(Inputs, StepsZeroSavesTheInitialWeights) {
  const testing::TempDir dir("inputs-save0");
  const model::ModelConfig run_model = model::shrink(model::preset("gpt2"), 8);
  const auto run =
      run_process(mpiexec(2) + kEmu + " --model gpt2 --shrink 8 --steps 0 --strategies zero3,ddp" + " --save-weights " +
                      dir.file("zero3.safetensors") + " --json " + dir.file("run.json"),
                  240);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("zero3's weights as initialised (--steps 0) to"), std::string::npos) << run.out;
  EXPECT_NE(run.err.find("saved zero3's weights after 0 steps to"), std::string::npos) << run.err;
  const json root = testing::read_json(dir.file("run.json"));
  EXPECT_EQ(root["config"]["saved_weights"]["strategy"], "zero3");
  EXPECT_EQ(root["config"]["saved_weights"]["steps"], 0);
  for (const json& s : root["strategies"]) {
    EXPECT_EQ(s["steps_run"], 0);
    EXPECT_TRUE(s["losses"].empty());
    EXPECT_EQ(s["verdict"], "fit");
  }
  write_initial_weights(run_model, kDefaultSeed, dir.file("initial.safetensors"));
  EXPECT_EQ(io::load_model_weights(dir.file("zero3.safetensors"), run_model),
            io::load_model_weights(dir.file("initial.safetensors"), run_model))
      << "no step taken: the seeded initial weights, exactly";
  // Set-up alone can run out of memory: DDP's states and buckets of gpt2 pass 2.5 GB (see the README's table).
  const auto oom = run_process(
      mpiexec(2) + kEmu + " --model gpt2 --shrink 8 --steps 0 --strategies ddp --cap " + "2.5GB-scaled --expect oom",
      120);
  EXPECT_EQ(oom.exit_code, 0) << oom.out << oom.err;
}

// uint16 ids as nanoGPT writes them, all below GPT-2's vocabulary of 50257.
void write_tokens(const std::string& path, const std::vector<uint16_t>& ids) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * sizeof(uint16_t)));
}

TEST(Inputs, TrainsOnATokenFile) {
  const testing::TempDir dir("inputs-tokens");
  std::vector<uint16_t> ids(20000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = uint16_t((i * 7919) % 50257);
  write_tokens(dir.file("train.bin"), ids);
  const json synthetic = run_json("", dir, "synthetic.json");
  const json file = run_json(" --tokens " + dir.file("train.bin"), dir, "tokens.json");
  EXPECT_NE(losses(file, 0), losses(synthetic, 0));
  expect_same_training(file);
  EXPECT_EQ(file["config"]["tokens"], dir.file("train.bin"));

  const auto header = run_process(
      mpiexec(2) + kEmu + " --model gpt2 --shrink 8 --steps 1 --strategies ddp --tokens " + dir.file("train.bin"), 120);
  EXPECT_EQ(header.exit_code, 0) << header.err;
  EXPECT_NE(header.out.find("16-bit ids, folded into the shrunk vocabulary: id mod "), std::string::npos) << header.out;
}

TEST(Inputs, BadTokenFilesAreBadInput) {
  const testing::TempDir dir("inputs-bad-tokens");
  write_tokens(dir.file("big.bin"), std::vector<uint16_t>(400, 60000));  // past GPT-2's 50257
  std::ofstream(dir.file("odd.bin"), std::ios::binary) << "abc";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {" --tokens " + dir.file("big.bin"), "token 0 at byte offset 0 is 60000, not below the vocabulary size"},
           {" --tokens " + dir.file("odd.bin"), "3 bytes is not a whole number of 2-byte tokens"},
           {" --tokens " + dir.file("none.bin"), "cannot be read: no such file"},
           {" --tokens " + dir.file("big.bin") + " --token-bits 8", "--token-bits 8 is not a token width"}}) {
    const auto run = run_process(mpiexec(2) + kEmu + kRun + args, 120);
    EXPECT_EQ(run.exit_code, 2) << args << "\n" << run.err;
    EXPECT_NE(run.err.find(message), std::string::npos) << args << "\n" << run.err;
  }
}

}  // namespace
}  // namespace emu
