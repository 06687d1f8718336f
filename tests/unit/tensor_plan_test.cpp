// tp at full scale (--plan): llama2-70b over one tensor-parallel group of 8 H100-80GB. The parameter counts are by
// hand from llama2-70b's shapes (h 8192, F 28672, V 32000, 64 heads, 8 KV heads of 128, 80 blocks), independent of
// emu's layouts:
//   a block's matrices: q and o 8192² each, k and v 8192·1024 each, gate, up and down 8192·28672 each
//            = 134,217,728 + 16,777,216 + 704,643,072 = 855,638,016, split over 8: 106,954,752; its two norms
//            (2·8192) whole on every rank: 106,971,136 per block per rank
//   vocabulary padded to a multiple of 128·8 = 1024 (Megatron's _vocab_size_with_padding): 32000 → 32768, 4096 rows
//            per rank of the embedding and of the head: 2·4096·8192 = 67,108,864; the final norm 8192
//   per rank: 80·106,971,136 + 67,108,864 + 8192 = 8,624,807,936 parameters, × 18 bytes (bf16 parameters, fp32 main
//            gradients, fp32 master weights, Adam m and v) = 155,246,542,848 bytes: TP 8 alone does not fit
// Traffic per step (one micro-batch): (4·80 + 2) all-reduces of b·s·h·2 = 4096·8192·2 bytes and 3 of b·s·4 =
// 4096·4 bytes, each rank sending 2·7/8 of every payload.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "app/options.h"
#include "app/plan.h"
#include "emu/check.h"
#include "tests/support/paths.h"

namespace emu::app {
namespace {

constexpr uint64_t kLocalParameters = 8'624'807'936;

RunOptions parse(const std::vector<std::string>& args, int world = 1) {
  std::vector<const char*> argv = {"emu"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data(), world).options;
}

// The InputError this command line is refused with, or "accepted".
std::string message(const std::vector<std::string>& args) {
  try {
    parse(args);
  } catch (const InputError& error) {
    return std::string(error.what());
  }
  return std::string("accepted");
}

TEST(TensorPlan, Llama70BOnEightH100sNeeds18BytesPerLocalParameter) {
  const RunOptions options =
      parse({"--plan", "8", "--model", "llama2-70b", "--cap", "h100-80gb", "--strategies", "tp", "--no-checkpoint"});
  ASSERT_EQ(options.strategies.size(), 1u);
  for (const int rank : {0, 7}) {
    const StrategyOutcome outcome = account_shapes(options, options.strategies.front(), options.full, 8, 1, rank);
    const CategoryBytes& c = outcome.category_peaks.front();
    EXPECT_EQ(c[Category::kParameters], 2 * kLocalParameters) << "rank " << rank;
    EXPECT_EQ(c[Category::kGradients], 4 * kLocalParameters) << "rank " << rank;
    EXPECT_EQ(c[Category::kMasterWeights], 4 * kLocalParameters) << "rank " << rank;
    EXPECT_EQ(c[Category::kOptimizerState], 8 * kLocalParameters) << "rank " << rank;
    EXPECT_FALSE(outcome.fits()) << "rank " << rank;
    EXPECT_EQ(outcome.prediction.model_state_bytes(), 18 * kLocalParameters) << "rank " << rank;
  }
}

TEST(TensorPlan, AllReducesPerStepAtRingVolume) {
  const RunOptions options =
      parse({"--plan", "8", "--model", "llama2-70b", "--cap", "h100-80gb", "--strategies", "tp", "--no-checkpoint"});
  const StrategyOutcome outcome = account_shapes(options, options.strategies.front(), options.full, 8, 1, 0);
  const TrafficKey world{coll::CollectiveKind::kAllReduce, "world"};
  const uint64_t sent = outcome.traffic_per_step.at(world).sent;
  const uint64_t calls = outcome.calls_per_step.at(world);
  constexpr uint64_t kHidden = uint64_t{4096} * 8192 * 2, kRows = uint64_t{4096} * 4;
  // Besides these, the gradient norm's one all-reduce of a 4-byte fp32 partial sum (a ring of 8 sends at most 8
  // bytes of it).
  EXPECT_EQ(calls, uint64_t{4 * 80 + 2 + 3 + 1});
  const uint64_t expected = (4 * 80 + 2) * kHidden * 14 / 8 + 3 * kRows * 14 / 8;
  EXPECT_GE(sent, expected);
  EXPECT_LE(sent, expected + 8);
}

// Megatron's constraints, each with the bad value and the accepted ones (InputError: exit 2 on every rank).
TEST(TensorPlan, SplitsThatDoNotDivideAreRefusedWithTheAcceptedSizes) {
  // llama2-7b: 32 heads, 32 kv heads, F 11008 = 2^8·43.
  EXPECT_NE(message({"--plan", "3", "--model", "llama2-7b", "--strategies", "tp"})
                .find("attention heads a (32) is not divisible by 3; accepted tensor-parallel sizes for it: 1, 2, 4, "
                      "8, 16, 32"),
            std::string::npos);
  // llama2-70b: 8 kv heads, 64 heads: TP 16 splits the heads but not the kv heads.
  EXPECT_NE(message({"--plan", "16", "--model", "llama2-70b", "--strategies", "tp"})
                .find("kv heads (8) is not divisible by 16; accepted tensor-parallel sizes for it: 1, 2, 4, 8"),
            std::string::npos);
  // gpt2: 12 heads.
  EXPECT_NE(
      message({"--plan", "8", "--model", "gpt2", "--strategies", "tp"})
          .find("attention heads a (12) is not divisible by 8; accepted tensor-parallel sizes for it: 1, 2, 3, 4, "
                "6, 12"),
      std::string::npos);
  EXPECT_NE(message({"--plan", "2", "--model", "gpt2", "--strategies", "tp", "--sequence-parallel"})
                .find("--sequence-parallel: gpt2 is gpt2, whose learned positions"),
            std::string::npos);
}

// GPT-2 from Hugging Face's config.json files (openai-community/gpt2, gpt2-medium) at full scale, split as Megatron
// splits its GPT (tensor_parallel.h), counted by hand from the configs' shapes (Conv1D [in, out]):
//   gpt2         h 768, 12 heads, F 3072, L 12, 1024 positions, V 50257; TP 2
//     a block's split tensors: c_attn 768·2304 + 2304, c_fc 768·3072 + 3072, attn.c_proj 768², mlp.c_proj 3072·768
//              = 7,083,264, over 2: 3,541,632; whole: ln_1, ln_2 (weight, bias) and the two c_proj biases 6·768
//              = 4,608: 3,546,240 per block per rank
//     wte padded to a multiple of 128·2 = 256: 50257 → 50432, 25216 rows per rank: 19,365,888 (the tied head); wpe
//              1024·768 = 786,432 and ln_f 1,536 whole
//     per rank: 12·3,546,240 + 19,365,888 + 786,432 + 1,536 = 62,708,736 (the whole model: 124,439,808, GPT-2's
//              published count)
//   gpt2-medium  h 1024, 16 heads, F 4096, L 24, V 50257; TP 8
//     a block's split tensors 3,145,728 + 3,072 + 4,194,304 + 4,096 + 1,048,576 + 4,194,304 = 12,590,080, over 8:
//              1,573,760; whole 6·1024 = 6,144: 1,579,904 per block per rank
//     wte padded to a multiple of 1024: 50257 → 51200, 6400 rows per rank: 6,553,600; wpe 1,048,576, ln_f 2,048
//     per rank: 24·1,579,904 + 6,553,600 + 1,048,576 + 2,048 = 45,521,920 (the whole model: 354,823,168)
// 18 bytes per local parameter (Megatron's bf16 recipe). Traffic per step, one micro-batch of s = 1024 without
// recomputation: 4L + 2 all-reduces of b·s·h·2 bytes (after attn.c_proj and mlp.c_proj; of the c_attn and c_fc
// input gradients; the embedding output, the head's input gradient), 3 of b·s·4 (the parallel cross-entropy) and
// the gradient norm's one of 4 bytes, each rank sending 2(t − 1)/t of each.
TEST(TensorPlan, Gpt2FromHuggingFaceConfigs) {
  struct Case {
    const char* file;
    int t;
    uint64_t local, layers, hidden;
  };
  for (const Case& c : {Case{"gpt2.json", 2, 62'708'736, 12, 768}, Case{"gpt2-medium.json", 8, 45'521'920, 24, 1024}}) {
    const std::string model = std::string(EMU_SOURCE_DIR) + "/tests/data/hf/" + c.file;
    const RunOptions options = parse({"--plan", std::to_string(c.t), "--model", model, "--strategies", "tp",
                                      "--no-checkpoint", "--seq-len", "1024"});
    for (const int rank : {0, c.t - 1}) {
      const StrategyOutcome outcome = account_shapes(options, options.strategies.front(), options.full, c.t, 1, rank);
      const CategoryBytes& bytes = outcome.category_peaks.front();
      EXPECT_EQ(bytes[Category::kParameters], 2 * c.local) << c.file << " rank " << rank;
      EXPECT_EQ(bytes[Category::kGradients], 4 * c.local) << c.file << " rank " << rank;
      EXPECT_EQ(bytes[Category::kMasterWeights], 4 * c.local) << c.file << " rank " << rank;
      EXPECT_EQ(bytes[Category::kOptimizerState], 8 * c.local) << c.file << " rank " << rank;
      EXPECT_EQ(outcome.prediction.model_state_bytes(), 18 * c.local) << c.file << " rank " << rank;
      const TrafficKey world{coll::CollectiveKind::kAllReduce, "world"};
      const uint64_t t = static_cast<uint64_t>(c.t);
      EXPECT_EQ(outcome.calls_per_step.at(world), 4 * c.layers + 2 + 3 + 1) << c.file;
      const uint64_t expected =
          (4 * c.layers + 2) * 1024 * c.hidden * 2 * 2 * (t - 1) / t + 3 * 1024 * 4 * 2 * (t - 1) / t;
      const uint64_t sent = outcome.traffic_per_step.at(world).sent;
      EXPECT_GE(sent, expected) << c.file;
      EXPECT_LE(sent, expected + 2 * t) << c.file << ": the gradient norm's 4 bytes at most";
    }
  }
}

// llama2-70b's sequence parallelism over T = 8 at full scale (L = 80, b·s·h·2 = 4096·8192·2 bytes, M = 1) in
// `group`: 4L + 2 = 322 reduce-scatters and 322 + 2L + 1 = 483 all-gathers of it, each rank sending 7/8 of each.
void expect_llama70b_sequence_parallel(const StrategyOutcome& outcome, const std::string& group) {
  constexpr uint64_t kHidden = uint64_t{4096} * 8192 * 2;
  const TrafficKey scatter{coll::CollectiveKind::kReduceScatter, group};
  const TrafficKey gather{coll::CollectiveKind::kAllGather, group};
  EXPECT_EQ(outcome.calls_per_step.at(scatter), uint64_t{4 * 80 + 2});
  EXPECT_EQ(outcome.traffic_per_step.at(scatter).sent, (4 * 80 + 2) * kHidden * 7 / 8);
  EXPECT_EQ(outcome.calls_per_step.at(gather), uint64_t{4 * 80 + 2 + 2 * 80 + 1});
  EXPECT_EQ(outcome.traffic_per_step.at(gather).sent, (6 * 80 + 3) * kHidden * 7 / 8);
}

// Sequence parallelism at full scale, the same llama2-70b over 8 (L = 80, b·s·h·2 = 4096·8192·2 bytes, M = 1): per
// step 4L + 2 = 322 reduce-scatters and 322 + 2L + 1 = 483 all-gathers of it, each rank sending 7/8 of each, in
// place of the 322 all-reduces at 2·7/8; and one all-reduce of the norm weights' gradients ((2·80 + 1)·8192 fp32).
TEST(TensorPlan, SequenceParallelReduceScattersAndAllGathers) {
  const RunOptions options = parse({"--plan", "8", "--model", "llama2-70b", "--cap", "h100-80gb", "--strategies", "tp",
                                    "--no-checkpoint", "--sequence-parallel"});
  const StrategyOutcome outcome = account_shapes(options, options.strategies.front(), options.full, 8, 1, 0);
  expect_llama70b_sequence_parallel(outcome, "world");
  const TrafficKey reduce{coll::CollectiveKind::kAllReduce, "world"};
  // 3 of the parallel cross-entropy, the norm gradients' one, the gradient norm's one.
  EXPECT_EQ(outcome.calls_per_step.at(reduce), uint64_t{3 + 1 + 1});
}

// Sequence parallelism and selective recomputation at full scale: llama2-70b, bf16 (e = 2), SDPA, T = 4096 tokens,
// h = 8192, over t = 8 (a/t = 8 heads, kv/t = 1 kv head of 128, F/t = 3584), no checkpointing. Per block, bytes
// (memory_terms.h, blocks.h), by hand:
//   norm region: the fp32 copies of the block input and of the residual after attention 2·4·T·h, each norm's
//     normalised tensor and output 4·2·T·h, rstd 2·4·T: 16·T·h + 8·T = 536,903,680; under sequence parallelism
//     the rank's T/8 rows: 67,112,960
//   split: q and the attention output 2·2·T·1024, k and v 2·2·T·128, gate, silu, up, product 4·2·T·3584:
//     16,777,216 + 2,097,152 + 117,440,512 = 136,314,880
//   scores: the logsumexp 4·b·(a/t)·s = 4·8·4096 = 131,072, 0 under selective recomputation
// So per block: without either 673,349,632; with sequence parallelism 203,558,912; with it and selective
// recomputation 203,427,840.
TEST(TensorPlan, SequenceParallelAndSelectiveActivationsPerBlock) {
  const auto per_block = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--plan",       "8",  "--model",        "llama2-70b", "--cap", "h100-80gb",
                                     "--strategies", "tp", "--no-checkpoint"};
    bool recompute = false;
    for (const std::string& flag : extra) recompute = recompute || flag == "--recompute";
    if (recompute) args.pop_back();  // --recompute says what --no-checkpoint did
    args.insert(args.end(), extra.begin(), extra.end());
    const RunOptions options = parse(args);
    const StrategyOutcome outcome = account_shapes(options, options.strategies.front(), options.full, 8, 1, 0);
    return (outcome.predicted_activations - 4 * uint64_t{4096} * 4096) / 80;  // less the fp32 log-softmax [T, V/t]
  };
  EXPECT_EQ(per_block({}), uint64_t{673'349'632});
  EXPECT_EQ(per_block({"--sequence-parallel"}), uint64_t{203'558'912});
  EXPECT_EQ(per_block({"--sequence-parallel", "--recompute", "selective"}), uint64_t{203'427'840});
}

// fsdp2 --tp 8 with sequence parallelism (torchtitan's default TP plan) at full scale, llama2-70b on 64 ranks (D = 8),
// the mixed recipe, no checkpointing, M = 1: the same tensor-parallel reduce-scatters and all-gathers as tp's above
// in the "tensor-parallel" group, no [b·s, h] all-reduce; each norm weight's gradient (2L + 1 = 161 of h = 8192 at
// bf16, the unsharded gradient's dtype, 16,384 bytes) all-reduced once in the step's one backward at 2·7/8, beside
// the cross-entropy's 3; and the same saved activations per block as tp --tp 8 --sequence-parallel (203,558,912).
TEST(TensorPlan, Fsdp2SequenceParallel) {
  const RunOptions options = parse({"--plan", "64", "--model", "llama2-70b", "--cap", "h100-80gb", "--strategies",
                                    "fsdp2", "--tp", "8", "--no-checkpoint", "--sequence-parallel"});
  const StrategyOutcome outcome = account_shapes(options, options.strategies.front(), options.full, 64, 1, 0);
  expect_llama70b_sequence_parallel(outcome, "tensor-parallel");
  const TrafficKey reduce{coll::CollectiveKind::kAllReduce, "tensor-parallel"};
  EXPECT_EQ(outcome.calls_per_step.at(reduce), uint64_t{3 + 161});
  EXPECT_EQ(outcome.traffic_per_step.at(reduce).sent,
            161 * (2 * 7 * uint64_t{8192} * 2 / 8) + 3 * (2 * 7 * 4 * 4096 / 8));
  EXPECT_EQ((outcome.predicted_activations - 4 * uint64_t{4096} * 4096) / 80, uint64_t{203'558'912});
}

// The flags' errors: the bad value and what is accepted (InputError: exit 2 on every rank).
TEST(TensorPlan, SequenceParallelAndRecomputeErrors) {
  EXPECT_NE(
      message({"--plan", "8", "--model", "llama2-7b", "--strategies", "tp", "--sequence-parallel", "--seq-len", "100"})
          .find("the sequence length s (100) is not divisible by 8; accepted: a sequence length that is a "
                "multiple of 8, or a tensor-parallel size dividing it: 1, 2, 4, 5, 10, 20, 25, 50, 100"),
      std::string::npos);
  EXPECT_NE(message({"--plan", "8", "--model", "llama2-7b", "--strategies", "ddp", "--sequence-parallel"})
                .find("--sequence-parallel splits tp's sequence; accepted with tp, pp --tp T or fsdp2 --tp T among "
                      "--strategies"),
            std::string::npos);
  EXPECT_NE(message({"--plan", "8", "--model", "llama2-7b", "--strategies", "tp", "--recompute", "partial"})
                .find("--recompute 'partial' is not one of full, selective, none"),
            std::string::npos);
  EXPECT_NE(
      message({"--plan", "8", "--model", "llama2-7b", "--strategies", "tp", "--recompute", "selective", "--checkpoint"})
          .find("accepted: one of them"),
      std::string::npos);
  EXPECT_EQ(message({"--plan", "8", "--model", "llama2-7b", "--strategies", "tp", "--recompute", "selective"}),
            "accepted");
  // Composed: the sequence is split over the TP group (4), not the 8 ranks; so are pp's and fsdp2's stages'.
  EXPECT_EQ(message({"--plan", "8", "--model", "llama2-7b", "--strategies", "tp", "--tp", "4", "--sequence-parallel",
                     "--seq-len", "100"}),
            "accepted");
  EXPECT_EQ(message({"--plan", "8", "--model", "llama2-7b", "--strategies", "pp,3d", "--tp", "4", "--pp", "2",
                     "--sequence-parallel", "--seq-len", "100"}),
            "accepted");
  EXPECT_NE(message({"--plan", "8", "--model", "llama2-7b", "--strategies", "pp", "--tp", "4", "--pp", "2",
                     "--sequence-parallel", "--seq-len", "102"})
                .find("the sequence length s (102) is not divisible by 4"),
            std::string::npos);
}

}  // namespace
}  // namespace emu::app
