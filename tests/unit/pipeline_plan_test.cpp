// pp at full scale (--plan): the classic "pipeline alone" row for a 70B full fine-tune on 8 × H100-80GB. Each stage
// keeps 16 bytes per parameter of its own layers (bf16 weights and gradients, fp32 master weights, Adam m and v),
// so ~141 GB on the first stage, far past 80 GB. The parameter counts below are by hand from llama2-70b's shapes
// (h 8192, F 28672, V 32000, 64 heads, 8 KV heads of 128, 80 blocks), independent of emu's layouts:
//   a block: q and o 8192² each, k and v 8192·1024 each, gate, up and down 8192·28672 each, two norms of 8192
//            = 134,217,728 + 16,777,216 + 704,643,072 + 16,384 = 855,654,400
//   embedding and head 32000·8192 = 262,144,000 each; final norm 8192
// 80 blocks over 8 stages, balanced with the embedding on the first and the head on the last, is 10 blocks each.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "app/options.h"
#include "app/plan.h"
#include "emu/check.h"

namespace emu::app {
namespace {

constexpr uint64_t kBlock = 855'654'400;
constexpr uint64_t kTable = 262'144'000;

RunOptions parse(const std::vector<std::string>& args, int world = 1) {
  std::vector<const char*> argv = {"emu"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data(), world).options;
}

uint64_t model_states(const StrategyOutcome& outcome) {
  const CategoryBytes& c = outcome.category_peaks.front();
  return c[Category::kParameters] + c[Category::kGradients] + c[Category::kMasterWeights] +
         c[Category::kOptimizerState];
}

TEST(PipelinePlan, Llama70BOnEightH100sNeeds16BytesPerParameterOfEachStage) {
  const RunOptions options =
      parse({"--plan", "8", "--model", "llama2-70b", "--cap", "h100-80gb", "--strategies", "pp"});
  ASSERT_EQ(options.strategies.size(), 1u);
  const StrategyOutcome first = account_shapes(options, options.strategies.front(), options.full, 8, 1, 0);
  const StrategyOutcome last = account_shapes(options, options.strategies.front(), options.full, 8, 1, 7);
  EXPECT_EQ(model_states(first), 16 * (10 * kBlock + kTable));
  EXPECT_EQ(model_states(last), 16 * (10 * kBlock + kTable + 8192));
  EXPECT_GT(first.peak.front(), uint64_t{140'000'000'000});  // ~141 GB of model states, activations on top
  EXPECT_FALSE(first.fits());
  // 1F1B: the first stage holds 8 micro-batches' activations, stage 1 seven, …: the first peaks above the middle.
  const StrategyOutcome second = account_shapes(options, options.strategies.front(), options.full, 8, 1, 1);
  EXPECT_GT(first.peak.front(), second.peak.front());
}

// One micro-batch's activation between two stages: b·s·h·2 = 1 × 4096 × 8192 × 2 bytes. With M = 8 (the default
// ranks × grad-accum), stage 0 sends 8 up, a middle stage 8 up and 8 down, the last 8 down.
TEST(PipelinePlan, EveryStageSendsItsActivationsAndGradients) {
  const RunOptions options =
      parse({"--plan", "8", "--model", "llama2-70b", "--cap", "h100-80gb", "--strategies", "pp"});
  constexpr uint64_t kMessage = uint64_t{4096} * 8192 * 2;
  for (const auto& [rank, messages] : std::vector<std::pair<int, uint64_t>>{{0, 8}, {3, 16}, {7, 8}}) {
    const StrategyOutcome outcome = account_shapes(options, options.strategies.front(), options.full, 8, 1, rank);
    uint64_t sent = 0, received = 0;
    for (const auto& [key, traffic] : outcome.traffic_per_step) {
      if (key.kind == coll::CollectiveKind::kSend) sent += traffic.sent;
      if (key.kind == coll::CollectiveKind::kRecv) received += traffic.received;
    }
    EXPECT_EQ(sent, messages * kMessage) << "stage " << rank;
    EXPECT_EQ(received, messages * kMessage) << "stage " << rank;
  }
}

TEST(PipelinePlan, MoreStagesThanBlocksIsRefusedWithTheArithmetic) {
  try {
    parse({"--plan", "64", "--model", "llama2-7b", "--strategies", "pp"});
    FAIL() << "64 stages of llama2-7b's 32 blocks were accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("64 ranks for llama2-7b's 32 blocks; accepted: 1 to 32"),
              std::string::npos)
        << error.what();
  }
  EXPECT_THROW(parse({"--strategies", "pp", "--schedule", "interleaved"}), InputError);
  EXPECT_THROW(parse({"--strategies", "pp", "--micro-batches", "0"}), InputError);
}

}  // namespace
}  // namespace emu::app
