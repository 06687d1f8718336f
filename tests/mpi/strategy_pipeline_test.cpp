// Pipeline parallelism (pp, strategies/pipeline.cpp) at P = the world: the point-to-point bytes of a step, each
// stage's activations under GPipe and 1F1B, the first stage peaking highest under 1F1B, and each stage's model
// states against the predictor. A Llama of 8 blocks (tests/mpi/strategy_harness.h, tiny_config: h = 16, s = 8,
// b = 1) in the fp32 recipe, so one micro-batch's activation between two stages is b·s·h·4 = 512 bytes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "strategies/analytic.h"
#include "tests/mpi/strategy_harness.h"
#include "workloads/model/memory_terms.h"

namespace emu::testing {
namespace {

constexpr int64_t kLayers = 8;

// One step of `micro_batches` micro-batches of one sequence each, every stage given all of them.
// Interleaved with `chunks` V > 1, over `layers` blocks.
std::unique_ptr<WorldRun> run_pipeline(strategy::Schedule schedule, int micro_batches, int chunks = 1,
                                       int64_t layers = kLayers) {
  strategy::StrategyOptions options = test_options("pp", optim::Recipe::kFp32);
  options.pipeline.schedule = schedule;
  options.pipeline.virtual_stages = chunks;
  const model::ModelConfig config = tiny_config(model::Style::kLlama, 1, layers);
  auto run = set_up_on_world(config, options);
  const auto data = tiny_data(config);
  std::vector<data::Batch> batches;
  batches.reserve(static_cast<size_t>(micro_batches));
  for (int m = 0; m < micro_batches; ++m) batches.push_back(data.batch(0, m, 1));
  run->strategy->step(batches);
  return run;
}

uint64_t sum_over_ranks(uint64_t mine) {
  MPI_Allreduce(MPI_IN_PLACE, &mine, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return mine;
}

// The blocks of stage s when 8 equal blocks split over P stages, by hand: the embedding (37 × 16) on the first
// stage and the final norm and head (16 + 37 × 16) on the last weigh less than a block (2,912 parameters), so
// the balanced split gives each stage 8/P blocks (P = 3: 3, 3, 2; the earlier stages take the extra blocks).
int blocks_on_stage(int stage, int stages) {
  const int base = kLayers / stages, extra = kLayers % stages;
  return base + (stage < extra ? 1 : 0);
}

class Pipeline : public ::testing::TestWithParam<strategy::Schedule> {};

// Every boundary carries each micro-batch's activation up and its gradient down: b·s·h·bytes·2·(P − 1)·M.
TEST_P(Pipeline, PointToPointBytesPerStep) {
  constexpr int kMicroBatches = 6;
  const int stages = world_size();
  auto run = run_pipeline(GetParam(), kMicroBatches);
  const coll::LedgerEntry sent = run->world->ledger().total(coll::CollectiveKind::kSend);
  const coll::LedgerEntry received = run->world->ledger().total(coll::CollectiveKind::kRecv);
  const uint64_t expected = uint64_t{1} * 8 * 16 * 4 * 2 * static_cast<uint64_t>(stages - 1) * kMicroBatches;
  EXPECT_EQ(sum_over_ranks(sent.moved.sent), expected);
  EXPECT_EQ(sum_over_ranks(received.moved.received), expected);
  // This stage: M sends up unless it is the last, M down unless it is the first.
  const int stage = world_rank();
  const uint64_t calls = kMicroBatches * ((stage < stages - 1 ? 1 : 0) + (stage > 0 ? 1 : 0));
  EXPECT_EQ(sent.calls, calls) << "stage " << stage;
  EXPECT_EQ(received.calls, calls) << "stage " << stage;
}

// Each micro-batch in flight holds the stage's blocks' saved activations (Korthikanti's per-block closed form,
// model/memory_terms.h), on the first stage its token ids (T int32 = 32 bytes), and on the last what the final norm
// and the loss keep for backward: the last block's output (T·h·4 = 512), the norm's rstd (T·4 = 32), its normalised
// tensor (512, LlamaRMSNorm's hidden_states · rstd), its output (512) and the fp32 log-softmax (T·V·4 = 8·37·4 =
// 1,184). GPipe holds all M at once; 1F1B at most min(P − s, M)
// on stage s. The difference between M = 8 and M = 1 is (in flight − 1) micro-batches exactly.
TEST_P(Pipeline, ActivationsInFlightPerStage) {
  const int stages = world_size();
  const int stage = world_rank();
  constexpr int kMicroBatches = 8;
  const uint64_t one = run_pipeline(GetParam(), 1)->device->memory().peak(Category::kActivations);
  const uint64_t many = run_pipeline(GetParam(), kMicroBatches)->device->memory().peak(Category::kActivations);
  model::ModelOptions options;
  options.compute = DType::kF32;
  const model::ModelConfig config = tiny_config(model::Style::kLlama, 1, kLayers);
  const uint64_t per_micro_batch =
      blocks_on_stage(stage, stages) * model::saved_activation_bytes_per_block(config, options) +
      (stage == 0 ? 32 : 0) + (stage == stages - 1 ? 512 + 32 + 512 + 512 + 1184 : 0);
  const int in_flight =
      GetParam() == strategy::Schedule::kGpipe ? kMicroBatches : std::min(stages - stage, kMicroBatches);
  EXPECT_EQ(many - one, static_cast<uint64_t>(in_flight - 1) * per_micro_batch)
      << "stage " << stage << " of " << stages << ": " << in_flight << " micro-batches in flight";
}

// Under 1F1B the first stage holds the most micro-batches, P, and peaks highest of all stages.
TEST(PipelineOneFOneB, FirstStagePeaksHighest) {
  if (world_size() < 2) GTEST_SKIP() << "one stage";
  auto run = run_pipeline(strategy::Schedule::k1F1B, 8);
  const uint64_t mine = run->device->memory().peak();
  std::vector<uint64_t> peaks(static_cast<size_t>(world_size()));
  MPI_Allgather(&mine, 1, MPI_UINT64_T, peaks.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (size_t s = 1; s < peaks.size(); ++s) EXPECT_GT(peaks[0], peaks[s]) << "stage " << s;
}

// Each stage's model states (16 bytes per parameter of its own layers in fp32: parameters, gradients, m, v) and
// its sends equal the predictor's (strategies/pipeline_model.cpp), and, by hand, stage s holds 4 · 4 bytes per
// parameter of its blocks (2,912 each: q 256, k 128, v 128, o 256, gate, up, down 704 each, two norms 16 each)
// plus 592 embedding parameters on the first stage and 608 (final norm and head) on the last.
TEST_P(Pipeline, ModelStatesEqualPredictorAndHand) {
  constexpr int kMicroBatches = 4;
  auto run = run_pipeline(GetParam(), kMicroBatches);
  strategy::AnalyticInput input = strategy::analytic_input(*run->model, world_size(), 1, kMicroBatches);
  input.rank = world_rank();
  strategy::StrategyOptions options = test_options("pp", optim::Recipe::kFp32);
  const strategy::Prediction predicted = strategy::predict(options, input);
  const MemoryPool& memory = run->device->memory();
  for (Category category :
       {Category::kParameters, Category::kGradients, Category::kMasterWeights, Category::kOptimizerState}) {
    EXPECT_EQ(memory.peak(category), predicted.peak[category]) << category_name(category);
  }
  const int stage = world_rank(), stages = world_size();
  uint64_t parameters = uint64_t{2912} * blocks_on_stage(stage, stages);
  if (stage == 0) parameters += 592;
  if (stage == stages - 1) parameters += 608;
  EXPECT_EQ(memory.peak(Category::kParameters), parameters * 4);
  EXPECT_EQ(memory.peak(Category::kOptimizerState), parameters * 8);
  EXPECT_EQ(run->world->ledger().total(coll::CollectiveKind::kSend).moved.sent,
            predicted.sent(coll::CollectiveKind::kSend));
}

// Interleaved 1F1B, V = 2 chunks of one block per stage (P·V blocks), M = 2P: a micro-batch crosses P·V − 1 chunk
// boundaries (the last stage's chunk 0 hands it back to the first stage's chunk 1), each way: b·s·h·4·2·(PV − 1)·M
// bytes per step, against 1F1B's 2(P − 1)·M on the same model (P = 2: 3 times; P = 4: 7/3). Stage s sends each
// chunk's M activations on and M gradients back, but none past the model's ends: M·(2V − [s = 0] − [s = P − 1]) calls,
// V times 1F1B's on a middle stage. The predictor agrees, and stage s holds blocks s + 1 and P + s + 1: 2 · 2,912
// parameters (+ 592 on the first stage, 608 on the last) at 16 bytes.
TEST(PipelineInterleaved, PointToPointGrowsWithTheChunks) {
  const int stages = world_size(), stage = world_rank();
  const int micro_batches = 2 * stages;
  const int64_t layers = 2 * stages;
  auto run = run_pipeline(strategy::Schedule::k1F1B, micro_batches, 2, layers);
  const coll::LedgerEntry sent = run->world->ledger().total(coll::CollectiveKind::kSend);
  const uint64_t message = uint64_t{1} * 8 * 16 * 4;
  EXPECT_EQ(sum_over_ranks(sent.moved.sent), message * 2 * static_cast<uint64_t>(2 * stages - 1) * micro_batches);
  EXPECT_EQ(sum_over_ranks(run->world->ledger().total(coll::CollectiveKind::kRecv).moved.received),
            message * 2 * static_cast<uint64_t>(2 * stages - 1) * micro_batches);
  const uint64_t calls = micro_batches * (4 - (stage == 0 ? 1 : 0) - (stage == stages - 1 ? 1 : 0));
  EXPECT_EQ(sent.calls, calls) << "stage " << stage;
  const auto plain = run_pipeline(strategy::Schedule::k1F1B, micro_batches, 1, layers);
  const uint64_t plain_calls = micro_batches * ((stage > 0 ? 1 : 0) + (stage < stages - 1 ? 1 : 0));
  EXPECT_EQ(plain->world->ledger().total(coll::CollectiveKind::kSend).calls, plain_calls) << "stage " << stage;

  strategy::AnalyticInput input = strategy::analytic_input(*run->model, stages, 1, micro_batches);
  input.rank = stage;
  strategy::StrategyOptions options = test_options("pp", optim::Recipe::kFp32);
  options.pipeline.virtual_stages = 2;
  const strategy::Prediction predicted = strategy::predict(options, input);
  EXPECT_EQ(sent.moved.sent, predicted.sent(coll::CollectiveKind::kSend));
  uint64_t parameters = uint64_t{2912} * 2;
  if (stage == 0) parameters += 592;
  if (stage == stages - 1) parameters += 608;
  const MemoryPool& memory = run->device->memory();
  EXPECT_EQ(memory.peak(Category::kParameters), parameters * 4);
  EXPECT_EQ(memory.peak(Category::kOptimizerState), parameters * 8);
  EXPECT_EQ(memory.peak(Category::kParameters), predicted.peak[Category::kParameters]);
  EXPECT_EQ(memory.peak(Category::kOptimizerState), predicted.peak[Category::kOptimizerState]);
}

// Interleaved 1F1B (V = 2, one block per chunk, P·V blocks) trains the numbers of single-device training on the same
// global batch: Llama with M = 2P micro-batches, and GPT-2 with M = P, its tied embedding on chunk 0 of the first stage
// and chunk 1 of the last. fp32; the tolerances of the equivalence ladder's 8-block pipelines
// (strategy_equivalence_test.cpp), which a missing 1/M (a factor M ≥ 2) or a chunk run out of order exceed by far.
TEST(PipelineInterleaved, SameAsSingleDevice) {
  constexpr int kSteps = 3;
  const int64_t layers = 2 * world_size();
  for (const auto& [style, accumulation] :
       std::vector<std::pair<model::Style, int>>{{model::Style::kLlama, 2}, {model::Style::kGpt2, 1}}) {
    strategy::StrategyOptions options = test_options("pp", optim::Recipe::kFp32);
    options.pipeline.virtual_stages = 2;
    const Trace reference = run_reference(style, options, world_size(), accumulation, kSteps, layers);
    const auto run = run_strategy(style, options, accumulation, kSteps, {}, /*weights_every_step=*/true, layers);
    const char* name = style == model::Style::kLlama ? "llama" : "gpt2";
    for (size_t step = 0; step < static_cast<size_t>(kSteps); ++step) {
      EXPECT_NEAR(run->trace.losses[step], reference.losses[step], 1e-6 * std::abs(reference.losses[step]))
          << name << " step " << step + 1;
      EXPECT_NEAR(run->trace.grad_norms[step], reference.grad_norms[step], 1e-5 * reference.grad_norms[step])
          << name << " step " << step + 1;
      EXPECT_LE(worst_weight_error(run->trace, reference, step).worst, 2e-6)
          << name << " step " << step + 1 << ": the largest weight error";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, Pipeline, ::testing::Values(strategy::Schedule::kGpipe, strategy::Schedule::k1F1B),
                         [](const ::testing::TestParamInfo<strategy::Schedule>& param) {
                           return param.param == strategy::Schedule::kGpipe ? std::string("gpipe")
                                                                            : std::string("one_f_one_b");
                         });

}  // namespace
}  // namespace emu::testing
