// PyTorch DDP's mixed recipe is torch.autocast(bfloat16) over the fp32 model: emu's ddp and ddp-zero run the model
// under autocast (strategy::framework_model_options) for every family, Gemma 2 included, and the other strategies
// keep their bf16 parameters and stream. Planned at full scale (--plan 8) for gemma-2-9b as its repository publishes
// it, at s 4096 (its sliding window), b 1, eager attention (transformers' default for Gemma 2), per block, by hand
// (h 3584, F 14336, 16 heads of d = 256: a·d = 4096, 8 kv heads: eager's repeat_kv copies of k and v are [T, a·d]):
//   autocast  the fp32 block input and residual after attention 2·4Th, input_layernorm's and
//             pre_feedforward_layernorm's fp32 normalised tensors 2·4Th, five linears' bf16 casts of those norms'
//             fp32 outputs 5·2Th, q and the attention output 2·2·T·ad, k and v 2·2·T·ad, gate, gelu(gate), up and
//             their product 4·2TF, rstd 2·4T and (1 + w) 2·4h; post_attention_layernorm and
//             post_feedforward_layernorm on the bf16 o_proj and down_proj outputs 2·(4Th fp32 copy + 4Th fp32
//             normalised tensor + 4T + 4h); eager attention b·a·s²·(2 soft-cap tanh + 4 fp32 softmax + 2 its bf16
//             cast) = 3,368,148,992 B; checkpointed 4Th = 58,720,256 B (the fp32 block input)
//   bf16      (zero2) the block input and residual after attention are not kept, their fp32 copies are (2·4Th), the
//             four norms' fp32 normalised tensors 2·4Th + the sandwich's, the outputs 2·2Th, everything after a
//             linear in bf16 as above: 3,280,068,608 B; checkpointed 2Th = 29,360,128 B
// The plan's predicted activations are 42 blocks plus the Trainer loss's fp32 log-softmax and bf16 soft-capped
// tanh of the logits (6·T·V, V = 256000), under every recipe. The run header's shrink report shows the same per
// block figure for the strategies it lists: autocast's for ddp, bf16's for zero2, both lines when both run.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "app/header.h"
#include "app/options.h"
#include "app/plan.h"
#include "tests/support/paths.h"

namespace emu::app {
namespace {

constexpr uint64_t T = 4096, h = 3584, F = 14336, ad = 4096, kScores = 16 * T * T, kLogits = 6 * T * 256000;

RunOptions gemma2(const std::string& strategies, bool checkpoint, bool plan = true) {
  const std::string model = std::string(EMU_SOURCE_DIR) + "/tests/data/hf/gemma-2-9b.json";
  std::vector<std::string> args = {"--model", model, "--strategies", strategies,
                                   checkpoint ? "--checkpoint" : "--no-checkpoint"};
  if (plan) args.insert(args.begin(), {"--plan", "8"});
  std::vector<const char*> argv = {"emu"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data(), plan ? 1 : 8).options;
}

uint64_t per_block(const std::string& strategy, bool checkpoint) {
  const RunOptions options = gemma2(strategy, checkpoint);
  const StrategyOutcome outcome = account_shapes(options, options.strategies.front(), options.full, 8, 8, 0);
  EXPECT_EQ((outcome.predicted_activations - kLogits) % 42, 0u) << strategy;
  return (outcome.predicted_activations - kLogits) / 42;
}

TEST(AutocastPlan, DdpRunsGemma2UnderAutocastAndZeroInBf16) {
  const uint64_t autocast = 8 * T * h + 8 * T * h + 10 * T * h + 4 * T * ad + 4 * T * ad + 8 * T * F + 8 * T + 8 * h +
                            2 * (8 * T * h + 4 * T + 4 * h) + 8 * kScores;
  ASSERT_EQ(autocast, uint64_t{3'368'148'992});  // README's figure (--model)
  const uint64_t bf16 = 8 * T * h + 8 * T * h + 4 * T * h + 4 * T * ad + 4 * T * ad + 8 * T * F + 8 * T + 8 * h +
                        2 * (8 * T * h + 4 * T + 4 * h) + 8 * kScores;
  ASSERT_EQ(bf16, uint64_t{3'280'068'608});
  EXPECT_EQ(per_block("ddp", false), autocast);
  EXPECT_EQ(per_block("ddp-zero", false), autocast);
  EXPECT_EQ(per_block("zero2", false), bf16);
  EXPECT_EQ(per_block("ddp", true), 4 * T * h);
  EXPECT_EQ(per_block("zero2", true), 2 * T * h);
}

// The header's "saved activations per block" lines at full scale, with the figures above.
std::vector<std::pair<std::string, double>> activation_lines(const std::string& strategies) {
  const RunOptions options = gemma2(strategies, false, false);
  std::vector<std::pair<std::string, double>> lines;
  const model::ShrinkReport report = run_shrink_report(options, 8);
  for (size_t i = 0; i < report.terms.size(); ++i) {
    if (report.terms[i].name != "saved activations per block") continue;
    lines.emplace_back(report.terms[i].name, report.terms[i].full);
    if (i + 1 < report.terms.size() && report.terms[i + 1].name.starts_with("  under")) {
      lines.emplace_back(report.terms[i + 1].name, report.terms[i + 1].full);
    }
  }
  return lines;
}

TEST(AutocastPlan, HeaderShowsTheActivationsEachListedStrategyKeeps) {
  using Lines = std::vector<std::pair<std::string, double>>;
  EXPECT_EQ(activation_lines("ddp"), (Lines{{"saved activations per block", 3'368'148'992.0}}));
  EXPECT_EQ(activation_lines("ddp-zero"), (Lines{{"saved activations per block", 3'368'148'992.0}}));
  EXPECT_EQ(activation_lines("zero2"), (Lines{{"saved activations per block", 3'280'068'608.0}}));
  EXPECT_EQ(activation_lines("ddp,zero2"),
            (Lines{{"saved activations per block", 3'280'068'608.0}, {"  under ddp's autocast", 3'368'148'992.0}}));
}

}  // namespace
}  // namespace emu::app
