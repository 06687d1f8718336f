// tp and pp composed with data parallelism (strategies/tensor_parallel.cpp, pipeline.cpp; strategy.h ParallelOptions):
// the world as D = N/(T·P) replicas, TP or PP inside each: TP 2 × DP D and PP 2 × DP D (D = 2 at 4 ranks, 4 at 8),
// TP 2 × PP 2 (× DP 2 at 8 ranks), with and without Megatron's distributed optimizer. A Llama of 4
// blocks made to split (h = 32, a = 8 heads of d = 4, kv = 4, F = 64, V = 1024: no vocabulary padding at t = 2,
// s = 8, b = 1) in the fp32 recipe. Checked against single-device training on the same global batch (replica d's
// micro-batch m is sample m·D + d: the reference's micro-batch m of D samples), and the traffic of each group
// against closed forms written here: the TP group's 4L + 2 all-reduces of b·s·h per micro-batch at 2(T − 1)/T, the
// pipeline's b·s·h per micro-batch per boundary, and the data-parallel group's one all-reduce of the local gradients
// at 2(D − 1)/D per step.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "strategies/analytic.h"
#include "tests/mpi/strategy_harness.h"
#include "tests/oracle/memory_oracle.h"
#include "workloads/model/memory_terms.h"

namespace emu::testing {
namespace {

constexpr int kSteps = 3;
constexpr int kMicroBatches = 2;  // per replica and step (tp: accumulation; pp: M)
constexpr int64_t kLayers = 4;

// `gpt2`: a GPT-2 of the same h, a and V (kv = a, F = 128, its head tied to wte, 8 learned positions), split as
// Megatron splits its GPT (tensor_parallel.h).
model::ModelConfig parallel_config(bool gpt2 = false) {
  model::ModelConfig config = tiny_config(gpt2 ? model::Style::kGpt2 : model::Style::kLlama, 1, kLayers);
  config.hidden = 32;
  config.heads = 8;
  config.kv_heads = gpt2 ? 8 : 4;
  config.ffn = gpt2 ? 128 : 64;
  config.vocab = 1024;
  return config;
}

// The names below with "gpt2-" in front run parallel_config(true).
bool is_gpt2(std::string_view name) { return name.starts_with("gpt2-"); }
std::string_view layout_name(std::string_view name) { return is_gpt2(name) ? name.substr(5) : name; }

// "tp", "pp", "pp-tp" (pp whose stages are TP `degree` too), each with "-do" for the distributed optimizer, of
// degree `degree`; pp's with "-v2" interleaved, 2 chunks of one block per stage; and "fsdp2-tp" (FSDP2 over the
// replicas of TP `degree` layers); "fsdp2-pp" (FSDP2 over each stage's replicas of PP `degree`, torchtitan's
// reshard_after_forward=False under PP) and "fsdp2-pp-tp" (its stages TP `degree` too: torchtitan's 3-D), each with
// "-v2" interleaved (torchtitan's Interleaved1F1B: 2 chunks of one block per stage, each an FSDP module); "zero1-tp"
// and "zero2-tp" (DeepSpeed's ZeRO-1/2 over the replicas of TP `degree` layers, Megatron-DeepSpeed).
// "zero3-tp", "fsdp-tp", "fsdp-grad-op-tp", "fsdp-no-shard-tp": ZeRO-3 and FSDP1 over the replicas of TP `degree`
// layers (sharded_units.h); "-tp4" for TP 4 whatever `degree`.
strategy::StrategyOptions parallel_options(std::string_view name, int degree) {
  if (name.starts_with("zero3-") || (name.starts_with("fsdp-") && name.ends_with("-tp")) || name.ends_with("-tp4")) {
    const size_t tp = name.rfind("-tp");
    strategy::StrategyOptions options = test_options(std::string(name.substr(0, tp)), optim::Recipe::kFp32);
    options.parallel.tensor = name.ends_with("-tp4") ? 4 : degree;
    return options;
  }
  if (name.starts_with("zero")) {
    strategy::StrategyOptions options = test_options(name.substr(0, 5), optim::Recipe::kFp32);
    options.parallel.tensor = degree;
    return options;
  }
  if (name.starts_with("fsdp2")) {
    strategy::StrategyOptions options = test_options("fsdp2", optim::Recipe::kFp32);
    if (name.find("-tp") != std::string_view::npos) options.parallel.tensor = degree;
    if (name.starts_with("fsdp2-pp")) {
      options.parallel.pipeline = degree;
      options.fsdp2.reshard_after_forward = false;
    }
    if (name.find("-v2") != std::string_view::npos) options.pipeline.virtual_stages = 2;
    return options;
  }
  const bool pipeline = name.starts_with("pp");
  strategy::StrategyOptions options = test_options(pipeline ? "pp" : "tp", optim::Recipe::kFp32);
  (pipeline ? options.parallel.pipeline : options.parallel.tensor) = degree;
  if (name.starts_with("pp-tp")) options.parallel.tensor = degree;
  options.parallel.distributed_optimizer = name.ends_with("-do");
  if (name.find("-v2") != std::string_view::npos) options.pipeline.virtual_stages = 2;
  return options;
}

// parallel_options, and "-gpipe" anywhere in the name for GPipe's schedule (1F1B otherwise).
strategy::StrategyOptions scheduled_options(std::string_view name, int degree) {
  const size_t gpipe = name.find("-gpipe");
  if (gpipe == std::string_view::npos) return parallel_options(name, degree);
  std::string plain(name);
  plain.erase(gpipe, 6);
  strategy::StrategyOptions options = parallel_options(plain, degree);
  options.pipeline.schedule = strategy::Schedule::kGpipe;
  return options;
}

// Every rank of replica d runs micro-batches m = 0 … count − 1 of samples m·D + d, as the app gives them
// (app/run.cpp replica_micro_batches).
std::unique_ptr<WorldRun> run_parallel(const strategy::StrategyOptions& options, int count, int steps,
                                       bool weights_every_step, bool gpt2 = false,
                                       model::ModelOptions model_options = {}) {
  const model::ModelConfig config = parallel_config(gpt2);
  auto run = set_up_on_world(config, options, model_options);
  const strategy::Mesh mesh = strategy::mesh_of(options, world_size(), world_rank());
  const auto data = tiny_data(config);
  for (int step = 0; step < steps; ++step) {
    std::vector<data::Batch> batches;
    batches.reserve(static_cast<size_t>(count));
    for (int m = 0; m < count; ++m) {
      batches.push_back(data.batch(step, data::sample_offset(mesh.data_rank(), mesh.data, m, 1), 1));
    }
    const strategy::StepResult result = run->strategy->step(batches);
    // The replica's mean: the mean over the ranks is the global batch's.
    record_step(run->trace, mean_over_world(result.loss), result, *run->strategy, run->model->num_units(),
                weights_every_step);
  }
  return run;
}

// The data-parallel degree of a degree-2 layout at this world: 2 at 4 ranks, 4 at 8.
uint64_t data_degree() { return static_cast<uint64_t>(world_size() / 2); }

// The global batch's D replicas at this world for `options` (1 at 4 ranks for TP 2 × PP 2, 2 at 8).
int replicas(const strategy::StrategyOptions& options) { return strategy::mesh_of(options, world_size(), 0).data; }

// fp32: only the order of the sums differs from the reference (TP's partial products, the replicas' average): a
// few ulps. A missing data-parallel all-reduce leaves each replica with its own half of the batch (the weights
// part at the first step by up to lr = 1e-2, the norm by far more than 1e-5); a norm summed over the replicas too
// is √D = 1.41 times the reference's.
constexpr double kLossTolerance = 1e-5, kNormTolerance = 1e-5, kWeightTolerance = 1e-5;

class Equivalence : public ::testing::TestWithParam<std::string> {};  // parallel_options' names, degree 2

// TP 2 × DP D and PP 2 × DP D (D = 2 at 4 ranks, 4 at 8), TP 2 × PP 2 (× DP 2 at 8), each with and without the
// distributed optimizer. GPT-2 under TP 2 × DP D, TP 2 × PP 2 (its tied wte on both end stages, as slices) and FSDP2
// over TP 2.
// ZeRO-3 and FSDP1 (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD) over TP 2, over TP 4 (D = 1 at 4 ranks, 2 at 8) and GPT-2's
// (its replicated biases and wpe counted once in the norm): a norm counting the TP duplicates T times, or a shard
// group of the world, moves the norm by more than 1e-5.
// "fsdp2-tp-sp": FSDP2 over TP 2 with sequence parallelism (torchtitan's default TP plan); a norm weight's gradient
// not all-reduced over the TP group (each rank's rows only) moves the norm and the norm weights at the first step.
// "pp-tp-sp" and "fsdp2-pp-tp-sp" (each also "-gpipe", and pp's with the distributed optimizer and interleaved): the
// same inside TP 2 × PP 2 stages, each TP rank sending its half of the sequence to the next stage; a stage that sent
// the whole b·s·h, or read its neighbour's half as its own, trains other numbers from the first step.
// "fsdp2-pp-v2", "fsdp2-pp-tp-v2": FSDP2 over interleaved stages (2 chunks per stage, each its own FSDP module,
// reduce-scattered after its own last backward), with TP 2 too.
// Runs the layout `name` of `degree` (parallel_options) against the reference.
void expect_same_as_single_device(std::string_view name, int degree) {
  const bool gpt2 = is_gpt2(name);
  std::string_view layout = layout_name(name);
  model::ModelOptions model_options;
  model_options.sequence_parallel = layout.ends_with("-sp");
  if (model_options.sequence_parallel) layout.remove_suffix(3);
  const strategy::StrategyOptions options = scheduled_options(layout, degree);
  const Trace reference =
      run_reference_config(parallel_config(gpt2), options, replicas(options), kMicroBatches, kSteps);
  const auto run = run_parallel(options, kMicroBatches, kSteps, true, gpt2, model_options);
  for (int step = 0; step < kSteps; ++step) {
    const size_t i = static_cast<size_t>(step);
    EXPECT_NEAR(run->trace.losses[i], reference.losses[i], kLossTolerance * std::abs(reference.losses[i]))
        << "step " << step + 1;
    EXPECT_NEAR(run->trace.grad_norms[i], reference.grad_norms[i], kNormTolerance * reference.grad_norms[i])
        << "step " << step + 1;
    const WeightError weights = worst_weight_error(run->trace, reference, i);
    EXPECT_LE(weights.worst, kWeightTolerance)
        << "step " << step + 1 << ", unit " << weights.unit << ", element " << weights.element;
  }
}

// "zero1-tp", "zero2-tp": DeepSpeed's partitions over the data-parallel group of each TP coordinate; a gradient
// norm counting the replicated norm weights on both TP ranks, or partitions cut over the world instead of the D
// replicas, move the norm (and the weights) at the first step. GPT-2's replicated c_proj biases and wpe too.
TEST_P(Equivalence, SameAsSingleDevice) { expect_same_as_single_device(GetParam(), 2); }

// ZeRO-2 over TP 4 (D = 2 at 8 ranks): a/4 = 2 heads, kv/4 = 1 kv head, F/4 = 16 per rank.
TEST(ZeroOverTensorParallel, Tp4SameAsSingleDevice) {
  if (world_size() != 8) GTEST_SKIP() << "TP 4 x DP 2 takes 8 ranks";
  expect_same_as_single_device("zero2-tp", 4);
}

// The test's name for parallel_options' names (with "-gpipe" and "-sp" after the layout).
std::string equivalence_name(const ::testing::TestParamInfo<std::string>& param) {
  std::string_view layout = layout_name(param.param);
  const std::string prefix = is_gpt2(param.param) ? "gpt2_" : "";
  std::string suffix;
  if (layout.ends_with("-sp")) {
    layout.remove_suffix(3);
    suffix = "_sequence_parallel";
  }
  if (layout.ends_with("-gpipe")) {
    layout.remove_suffix(6);
    suffix = "_gpipe" + suffix;
  }
  if (layout.starts_with("zero3-") || layout.starts_with("fsdp-")) {
    std::string name = prefix + std::string(layout) + (layout.ends_with("4") ? "" : "2") + suffix;
    std::replace(name.begin(), name.end(), '-', '_');
    return name;
  }
  if (layout.starts_with("zero")) return prefix + std::string(layout.substr(0, 5)) + "_tp2" + suffix;
  if (layout == "fsdp2-tp") return prefix + "fsdp2_tp2" + suffix;
  if (layout == "fsdp2-pp") return prefix + "fsdp2_pp2" + suffix;
  if (layout == "fsdp2-pp-tp") return prefix + "fsdp2_pp2_tp2" + suffix;
  if (layout == "fsdp2-pp-v2") return prefix + "fsdp2_pp2_interleaved" + suffix;
  if (layout == "fsdp2-pp-tp-v2") return prefix + "fsdp2_pp2_tp2_interleaved" + suffix;
  std::string name =
      prefix + (layout.starts_with("pp-tp") ? std::string("pp2_tp2_dp") : std::string(layout.substr(0, 2)) + "2_dp");
  if (layout.find("-v2") != std::string_view::npos) name += "_interleaved";
  return (layout.ends_with("-do") ? name + "_distributed_optimizer" : name) + suffix;
}

INSTANTIATE_TEST_SUITE_P(Parallel, Equivalence,
                         ::testing::Values("tp", "pp", "tp-do", "pp-do", "pp-tp", "pp-tp-do", "pp-v2-do", "pp-tp-v2",
                                           "fsdp2-tp", "fsdp2-tp-sp", "fsdp2-pp", "fsdp2-pp-tp", "fsdp2-pp-v2",
                                           "fsdp2-pp-tp-v2", "gpt2-tp-do", "gpt2-pp-tp", "gpt2-fsdp2-tp", "zero1-tp",
                                           "zero2-tp", "gpt2-zero2-tp", "pp-tp-sp", "pp-tp-gpipe-sp", "pp-tp-do-sp",
                                           "pp-tp-v2-sp", "fsdp2-pp-tp-sp", "fsdp2-pp-tp-gpipe-sp", "fsdp2-pp-tp-v2-sp",
                                           "zero3-tp", "fsdp-tp", "fsdp-grad-op-tp", "fsdp-no-shard-tp", "zero3-tp4",
                                           "fsdp-tp4", "gpt2-zero3-tp", "gpt2-fsdp-tp"),
                         equivalence_name);

// Local parameters of a rank, by hand. A block's matrices at full shape: q and o 32·32, k and v 16·32 (kv = 4 heads
// of 4), gate, up and down 64·32: 9,216; its two norms 32 each. The root: embedding and head 1,024·32 each, the
// final norm 32.
constexpr uint64_t kBlockMatrices = 32 * 32 + 2 * 16 * 32 + 32 * 32 + 3 * 64 * 32;
constexpr uint64_t kBlockNorms = 2 * 32;
constexpr uint64_t kTable = 1024 * 32;

// The TP group's all-reduces of the hidden state (Megatron's f and g) by `run` on this rank: per micro-batch 4L + 2
// of b·s·h·4 = 1,024 bytes, each sending 2(T − 1)/T of it.
void expect_hidden_all_reduces(const WorldRun& run, uint64_t tp) {
  uint64_t calls = 0, sent = 0;
  for (const auto& [key, entry] : run.ledger("tensor-parallel").entries()) {
    if (key.first == coll::CollectiveKind::kAllReduce && std::string_view(key.second).starts_with("tp all-reduce")) {
      calls += entry.calls, sent += entry.moved.sent;
    }
  }
  EXPECT_EQ(calls, kMicroBatches * (4 * kLayers + 2));
  EXPECT_EQ(sent, kMicroBatches * (4 * kLayers + 2) * 2 * (tp - 1) * 1024 / tp);
}

// The bytes the predictor (strategies/analytic.h) has this rank send per step in `group`, every kind together.
uint64_t predicted_group_sent(const WorldRun& run, const strategy::StrategyOptions& options, std::string_view group) {
  strategy::AnalyticInput input = strategy::analytic_input(*run.model, world_size(), 1, kMicroBatches);
  input.rank = world_rank();
  uint64_t sent = 0;
  for (const strategy::PredictedTraffic& t : strategy::predict(options, input).traffic) {
    if (t.group == group) sent += t.sent;
  }
  return sent;
}

// The groups' traffic for one step of 2 micro-batches per replica, fp32 (4 bytes), against the closed forms, and the
// predictor (strategies/tp_model.cpp, pipeline_model.cpp) against the run.
TEST(ParallelTraffic, TensorGroupAndDataGroup) {
  const strategy::StrategyOptions options = parallel_options("tp", 2);
  const auto run = run_parallel(options, kMicroBatches, 1, false);
  constexpr uint64_t kT = 2;
  const uint64_t kD = data_degree();
  expect_hidden_all_reduces(*run, kT);  // TP: 18 per micro-batch
  // DP: every unit's local gradients once per step: the blocks' matrices / T with their whole norms, the root's
  // tables / T and its final norm, each all-reduced at 2(D − 1)/D.
  const uint64_t local = kLayers * (kBlockMatrices / kT + kBlockNorms) + 2 * kTable / kT + 32;
  const coll::LedgerEntry data = run->ledger("data-parallel").total(coll::CollectiveKind::kAllReduce);
  const uint64_t data_calls = data.calls, data_sent = data.moved.sent;
  EXPECT_EQ(data_calls, uint64_t{kLayers} + 1);  // one per unit
  EXPECT_EQ(data_sent, 4 * local * 2 * (kD - 1) / kD);
  strategy::AnalyticInput input = strategy::analytic_input(*run->model, world_size(), 1, kMicroBatches);
  input.rank = world_rank();
  const strategy::Prediction predicted = strategy::predict(options, input);
  uint64_t predicted_data = 0;
  for (const strategy::PredictedTraffic& t : predicted.traffic) {
    if (t.group == "data-parallel") predicted_data += t.sent;
  }
  EXPECT_EQ(predicted_data, data_sent);
}

// Megatron's distributed optimizer (ZeRO-1 over the data-parallel group): each unit's gradients reduce-scattered
// and its parameters all-gathered, (D − 1)/D of each (every unit's local count divides by D = 2 and 4); the Adam
// moments (fp32 m and v, 8 bytes) of 1/D of each unit on each rank, the parameters and gradients whole.
TEST(ParallelTraffic, DistributedOptimizer) {
  const strategy::StrategyOptions options = parallel_options("tp-do", 2);
  const auto run = run_parallel(options, kMicroBatches, 1, false);
  constexpr uint64_t kT = 2;
  const uint64_t local = kLayers * (kBlockMatrices / kT + kBlockNorms) + 2 * kTable / kT + 32;
  const coll::Ledger& data = run->ledger("data-parallel");
  const uint64_t scattered = data.total(coll::CollectiveKind::kReduceScatter).moved.sent;
  const uint64_t gathered = data.total(coll::CollectiveKind::kAllGather).moved.sent;
  const uint64_t reduced = data.total(coll::CollectiveKind::kAllReduce).moved.sent;
  const uint64_t kD = data_degree();
  EXPECT_EQ(scattered, 4 * local * (kD - 1) / kD);
  EXPECT_EQ(gathered, 4 * local * (kD - 1) / kD);
  EXPECT_EQ(reduced, 0u);
  MemoryPool& memory = run->device->memory();
  EXPECT_EQ(memory.peak(Category::kParameters), 4 * local);
  EXPECT_EQ(memory.peak(Category::kGradients), 4 * local);
  EXPECT_EQ(memory.peak(Category::kOptimizerState), 8 * local / kD);
  strategy::AnalyticInput input = strategy::analytic_input(*run->model, world_size(), 1, kMicroBatches);
  input.rank = world_rank();
  const strategy::Prediction predicted = strategy::predict(options, input);
  EXPECT_EQ(predicted.sent(coll::CollectiveKind::kReduceScatter), scattered);
  EXPECT_EQ(predicted.sent(coll::CollectiveKind::kAllGather), gathered);
  EXPECT_EQ(predicted.peak[Category::kOptimizerState], memory.peak(Category::kOptimizerState));
}

// FSDP2 over TP 2 (torchtitan's 2-D mesh): the TP group's all-reduces as tp's, and over the data-parallel group
// of D every unit's local slice sharded on dim 0 (every local tensor's rows divide by D = 2 and 4: no padding):
// per step an all-gather of each unit's local elements in forward, again for each block in backward (reshard after
// forward), and a reduce-scatter of each unit's gradients, (D − 1)/D of each at fp32. Per rank: the fp32 sharded
// parameters (the optimizer's own, no master copy), the sharded gradients and Adam's m and v over local/D
// elements, plus the unsharded units while in use.
TEST(ParallelTraffic, Fsdp2OverTensorParallelLayers) {
  const strategy::StrategyOptions options = parallel_options("fsdp2-tp", 2);
  const auto run = run_parallel(options, kMicroBatches, 1, false);
  constexpr uint64_t kT = 2;
  const uint64_t kD = data_degree();
  expect_hidden_all_reduces(*run, kT);
  const uint64_t block = kBlockMatrices / kT + kBlockNorms, root = 2 * kTable / kT + 32;
  const coll::Ledger& data = run->ledger("data-parallel");
  const uint64_t gathered = data.total(coll::CollectiveKind::kAllGather).moved.sent;
  const uint64_t scattered = data.total(coll::CollectiveKind::kReduceScatter).moved.sent;
  EXPECT_EQ(gathered, kMicroBatches * 4 * (root + 2 * kLayers * block) * (kD - 1) / kD);
  EXPECT_EQ(scattered, kMicroBatches * 4 * (root + kLayers * block) * (kD - 1) / kD);
  MemoryPool& memory = run->device->memory();
  const uint64_t local = kLayers * block + root;
  EXPECT_EQ(memory.peak(Category::kOptimizerState), 12 * local / kD);  // m and v, and foreach AdamW's 4 B copy
  EXPECT_EQ(memory.peak(Category::kMasterWeights), 0u);
  strategy::AnalyticInput input = strategy::analytic_input(*run->model, world_size(), 1, kMicroBatches);
  input.rank = world_rank();
  const strategy::Prediction predicted = strategy::predict(options, input);
  EXPECT_EQ(predicted.sent(coll::CollectiveKind::kAllGather), gathered);
  EXPECT_EQ(predicted.sent(coll::CollectiveKind::kReduceScatter), scattered);
  EXPECT_EQ(predicted.peak[Category::kOptimizerState], memory.peak(Category::kOptimizerState));
  EXPECT_EQ(predicted.peak[Category::kParameters], memory.peak(Category::kParameters));
}

// ZeRO-1 and ZeRO-2 over TP 2 (Megatron-DeepSpeed), fp32: the TP group's all-reduces as tp's, and over the
// data-parallel group of D the flat group of the rank's local elements (51,488: a multiple of 2D at D = 2 and 4, no
// padding) all-reduced in one slice per owner, as DeepSpeed 0.19's average_tensor reduces a bucket, 2(D − 1)/D of its
// 4-byte gradients (one bucket: reduce_bucket_size is far larger), by ZeRO-1 once per step after the last backward
// and by ZeRO-2 once per micro-batch, and the updated partitions all-gathered once per step, (D − 1)/D of its
// parameters. Nothing of it in the world's ledger but the norm.
TEST(ParallelTraffic, ZeroOverTensorParallelLayers) {
  for (const int stage : {1, 2}) {
    SCOPED_TRACE(stage);
    const strategy::StrategyOptions options = parallel_options(stage == 1 ? "zero1-tp" : "zero2-tp", 2);
    const auto run = run_parallel(options, kMicroBatches, 1, false);
    constexpr uint64_t kT = 2;
    const uint64_t kD = data_degree();
    expect_hidden_all_reduces(*run, kT);
    const uint64_t local = kLayers * (kBlockMatrices / kT + kBlockNorms) + 2 * kTable / kT + 32;
    const coll::Ledger& data = run->ledger("data-parallel");
    const coll::LedgerEntry reduced = data.total(coll::CollectiveKind::kAllReduce);
    const uint64_t reductions = stage == 1 ? 1 : kMicroBatches;
    EXPECT_EQ(reduced.calls, reductions);
    EXPECT_EQ(reduced.moved.sent, reductions * 2 * 4 * local * (kD - 1) / kD);
    EXPECT_EQ(data.total(coll::CollectiveKind::kReduceScatter).calls, 0u);
    EXPECT_EQ(data.total(coll::CollectiveKind::kAllGather).moved.sent, 4 * local * (kD - 1) / kD);
    EXPECT_EQ(run->world->ledger().total(coll::CollectiveKind::kReduceScatter).calls, 0u);
    EXPECT_EQ(run->world->ledger().total(coll::CollectiveKind::kAllGather).calls, 0u);
    EXPECT_EQ(predicted_group_sent(*run, options, "data-parallel"),
              reduced.moved.sent + data.total(coll::CollectiveKind::kAllGather).moved.sent);
    EXPECT_EQ(predicted_group_sent(*run, options, "tensor-parallel"),
              run->ledger("tensor-parallel").total(coll::CollectiveKind::kAllReduce).moved.sent);
  }
}

strategy::Prediction expect_predicted_memory(const WorldRun& run, const strategy::StrategyOptions& options,
                                             int micro_batches = kMicroBatches);

// ZeRO-3 and FSDP1 over TP 2 (sharded_units.h; PyTorch's 2-D FSDP recipe, DeepSpeed with Megatron's mpu): per
// micro-batch the TP group's 4L + 2 = 18 all-reduces of b·s·h·4 = 1,024 bytes as tp's, and over the "data-parallel"
// group of D each unit's flat local slice (a block's 9,216/2 matrix elements and its 64 norm weights, 4,672; the
// root's two tables / 2 and the final norm, 32,800; both divide by D = 2 and 4: no padding) sharded over D: the root
// all-gathered once (gathered from forward to backward), each block twice (forward, backward), every unit's
// gradients reduce-scattered, (D − 1)/D of each at fp32. The gradient norm: one all-reduce of 4 bytes over the
// data-parallel group, one over the TP group. A shard group of the world would move (N − 1)/N instead; a missing
// 1/D (sharding the whole slice over every rank) doubles the shards below.
struct ShardedTensorRun {
  uint64_t block = kBlockMatrices / 2 + kBlockNorms, root = 2 * kTable / 2 + 32;
  uint64_t local = kLayers * block + root;
  uint64_t d = data_degree();
  std::unique_ptr<WorldRun> run;
};
ShardedTensorRun run_sharded_tensor(std::string_view name, void (*tweak)(strategy::StrategyOptions&) = nullptr) {
  strategy::StrategyOptions options = parallel_options(name, 2);
  if (tweak != nullptr) tweak(options);
  ShardedTensorRun r;
  r.run = run_parallel(options, kMicroBatches, 1, false);
  uint64_t hidden_calls = 0, hidden_sent = 0, norm_calls = 0;
  for (const auto& [key, entry] : r.run->ledger("tensor-parallel").entries()) {
    if (key.first != coll::CollectiveKind::kAllReduce) continue;
    const std::string_view phase(key.second);
    if (phase.starts_with("tp all-reduce")) hidden_calls += entry.calls, hidden_sent += entry.moved.sent;
    if (phase.starts_with("clip")) norm_calls += entry.calls;
  }
  EXPECT_EQ(hidden_calls, kMicroBatches * (4 * kLayers + 2));
  // b·s·h = 256 elements at the compute dtype (the recipe's parameters'), 2(T − 1)/T = 1
  EXPECT_EQ(hidden_sent, kMicroBatches * (4 * kLayers + 2) * 256 * dtype_size(options.recipe.params));
  EXPECT_EQ(norm_calls, 1u);
  // The predictor (zero3_model.cpp, fsdp_model.cpp) equals the run per group and collective, and per category.
  const strategy::Prediction predicted = expect_predicted_memory(*r.run, options);
  for (const char* group : {"data-parallel", "tensor-parallel"}) {
    for (const coll::CollectiveKind kind :
         {coll::CollectiveKind::kAllReduce, coll::CollectiveKind::kReduceScatter, coll::CollectiveKind::kAllGather}) {
      uint64_t want = 0;
      for (const strategy::PredictedTraffic& p : predicted.traffic) {
        if (p.group == group && p.kind == kind) want += p.sent;
      }
      // The norm's one fp32 element: a ring of D > 2 cannot cut it into D chunks and sends it whole, 4 bytes
      // where the nominal 2(D − 1)/D·4 says up to 8.
      const double slack = kind == coll::CollectiveKind::kAllReduce ? 4.0 : 0.0;
      EXPECT_NEAR(static_cast<double>(want), static_cast<double>(r.run->ledger(group).total(kind).moved.sent), slack)
          << group << " " << static_cast<int>(kind);
    }
  }
  return r;
}

// Per step in the data-parallel group: the root all-gathered once per micro-batch and each block twice, every unit
// reduce-scattered once, (D − 1)/D of each at fp32; the norm's one all-reduce.
void expect_full_shard_traffic(const ShardedTensorRun& r) {
  const coll::Ledger& data = r.run->ledger("data-parallel");
  EXPECT_EQ(data.total(coll::CollectiveKind::kAllGather).moved.sent,
            kMicroBatches * 4 * (r.root + 2 * kLayers * r.block) * (r.d - 1) / r.d);
  EXPECT_EQ(data.total(coll::CollectiveKind::kReduceScatter).moved.sent,
            kMicroBatches * 4 * (r.root + kLayers * r.block) * (r.d - 1) / r.d);
  EXPECT_EQ(data.total(coll::CollectiveKind::kAllReduce).calls, 1u);
}

// FSDP FULL_SHARD over TP 2, fp32 (the flat shards are the parameters: no master copy). Parameters: the shards
// 4·local/D, the root gathered throughout and two blocks at once (BACKWARD_PRE prefetch). Gradients (2 micro-
// batches: every unit's fp32 shard from the first): the shards, and at the end of backward the root's unsharded
// gradients (its parts) beside their concatenation into its FlatParameter's .grad, 4·(local/D + 2·root). Adam's m
// and v and foreach AdamW's copy: 12·local/D.
TEST(ParallelTraffic, FsdpOverTensorParallelLayers) {
  const ShardedTensorRun r = run_sharded_tensor("fsdp-tp");
  const uint64_t d = r.d;
  expect_full_shard_traffic(r);
  const MemoryPool& memory = r.run->device->memory();
  EXPECT_EQ(memory.peak(Category::kParameters), 4 * r.local / d + 4 * (r.root + 2 * r.block));
  EXPECT_EQ(memory.peak(Category::kGradients), 4 * (r.local / d + 2 * r.root));
  EXPECT_EQ(memory.peak(Category::kOptimizerState), 12 * r.local / d);
  EXPECT_EQ(memory.peak(Category::kMasterWeights), 0u);
}

// NO_SHARD over TP 2: every rank keeps its whole slice; each unit's gradients all-reduced over the D replicas per
// micro-batch, 2(D − 1)/D of 4·local; nothing gathered or scattered. Parameters 4·local, m, v and foreach's copy
// 12·local.
TEST(ParallelTraffic, FsdpNoShardOverTensorParallelLayers) {
  const ShardedTensorRun r = run_sharded_tensor("fsdp-no-shard-tp");
  const uint64_t d = r.d;
  const coll::Ledger& data = r.run->ledger("data-parallel");
  EXPECT_EQ(data.total(coll::CollectiveKind::kAllGather).moved.sent, 0u);
  EXPECT_EQ(data.total(coll::CollectiveKind::kReduceScatter).moved.sent, 0u);
  EXPECT_EQ(data.total(coll::CollectiveKind::kAllReduce).moved.sent, kMicroBatches * 4 * r.local * 2 * (d - 1) / d);
  const MemoryPool& memory = r.run->device->memory();
  EXPECT_EQ(memory.peak(Category::kParameters), 4 * r.local);
  EXPECT_EQ(memory.peak(Category::kOptimizerState), 12 * r.local);
}

// ZeRO-3 over TP 2, fp32, DeepSpeed's sizes ÷ 32² (the persistence threshold 97 elements: the norms, h = 32, persist),
// no prefetch and stage3_max_reuse_distance 0 (nothing kept from forward to backward): the same all-gathers and
// reduce-scatters as FULL_SHARD above. Parameters: the partitions 4·local/D, plus at most the largest tensor in use
// (a table / 2: the embedding or the head) beside every norm, each gathered once and kept (32 each: the final norm
// and two per block). Gradients: the partitions, plus the more of the largest .grad (a table / 2, 16,384) and
// step()'s one sub-group (976,562 elements ÷ 32²: all of it) flattened at fp32, local/D. Adam's m and v over local/D
// (FusedAdam: no temporaries). The ipg bucket: 500,000,000 / 32² = 488,281 elements at fp32.
TEST(ParallelTraffic, Zero3OverTensorParallelLayers) {
  const ShardedTensorRun r = run_sharded_tensor("zero3-tp", [](strategy::StrategyOptions& o) {
    o.shrink = 32;
    o.zero.max_reuse_distance = 0;
    o.zero.prefetch_bucket_elements = 0;
  });
  const uint64_t d = r.d;
  expect_full_shard_traffic(r);
  const MemoryPool& memory = r.run->device->memory();
  EXPECT_EQ(memory.peak(Category::kParameters), 4 * r.local / d + 4 * (kTable / 2 + 32 * (1 + 2 * kLayers)));
  EXPECT_EQ(memory.peak(Category::kGradients), 4 * r.local / d + 4 * std::max<uint64_t>(kTable / 2, r.local / d));
  EXPECT_EQ(memory.peak(Category::kOptimizerState), 8 * r.local / d);
  EXPECT_EQ(memory.peak(Category::kBuckets), 4 * uint64_t{488'281});
}

// The mixed recipe over TP 2 (FSDP1's fp32 flat shard as the master, a bf16 _mp_shard per all-gather; ZeRO-3's bf16
// partitions beside the fp32 master): the predictor equals the run in every category and group.
TEST(ParallelTraffic, ShardedOverTensorParallelLayersMixedPrecision) {
  for (const char* name : {"zero3-tp", "fsdp-tp", "fsdp-grad-op-tp", "fsdp-no-shard-tp"}) {
    SCOPED_TRACE(name);
    run_sharded_tensor(name, [](strategy::StrategyOptions& o) {
      o.recipe = optim::precision_recipe(optim::Recipe::kMixed);
      o.shrink = 32;
    });
  }
}

TEST(ParallelTraffic, PipelineGroupAndDataGroup) {
  const strategy::StrategyOptions options = parallel_options("pp", 2);
  const auto run = run_parallel(options, kMicroBatches, 1, false);
  const int stage = world_rank() % 2;
  // One boundary: stage 0 sends each micro-batch's activation, stage 1 each one's gradient, b·s·h·4 = 1,024 bytes.
  const coll::LedgerEntry send = run->ledger("pipeline").total(coll::CollectiveKind::kSend);
  const uint64_t sends = send.calls, sent = send.moved.sent;
  EXPECT_EQ(sends, uint64_t{kMicroBatches});
  EXPECT_EQ(sent, uint64_t{kMicroBatches} * 1024);
  // DP: the stage's own units' gradients at 2(D − 1)/D: two blocks each (4 equal blocks over 2 stages), and the
  // embedding on stage 0, the final norm and head on stage 1.
  const uint64_t owned = 2 * (kBlockMatrices + kBlockNorms) + (stage == 0 ? kTable : kTable + 32);
  const uint64_t data_sent = run->ledger("data-parallel").total(coll::CollectiveKind::kAllReduce).moved.sent;
  EXPECT_EQ(data_sent, 4 * owned * 2 * (data_degree() - 1) / data_degree());
  strategy::AnalyticInput input = strategy::analytic_input(*run->model, world_size(), 1, kMicroBatches);
  input.rank = world_rank();
  const strategy::Prediction predicted = strategy::predict(options, input);
  uint64_t predicted_data = 0, predicted_sends = 0;
  for (const strategy::PredictedTraffic& t : predicted.traffic) {
    if (t.group == "data-parallel") predicted_data += t.sent;
    if (t.group == "pipeline" && t.kind == coll::CollectiveKind::kSend) predicted_sends += t.sent;
  }
  EXPECT_EQ(predicted_data, data_sent);
  EXPECT_EQ(predicted_sends, sent);
}

// TP 2 × PP 2 (× DP 2 at 8 ranks): every stage's TP group all-reduces b·s·h·4 = 1,024 bytes 4 times per block
// (2 blocks per stage), plus once on the first stage (the embedding output) and on the last (the head's input
// gradient), per micro-batch, at 2(T − 1)/T = 1; the last stage also the cross-entropy's 3 of b·s·4 = 32 bytes.
// The pipeline between TP rank t of each stage carries the whole b·s·h activation (no scatter-gather: 1,024
// bytes per micro-batch); the data-parallel group (8 ranks) all-reduces the stage's local gradients once.
TEST(ParallelTraffic, TensorParallelStages) {
  const strategy::StrategyOptions options = parallel_options("pp-tp", 2);
  const auto run = run_parallel(options, kMicroBatches, 1, false);
  const strategy::Mesh mesh = strategy::mesh_of(options, world_size(), world_rank());
  const bool first = mesh.pipeline_rank() == 0;
  uint64_t hidden = 0, rows = 0;
  for (const auto& [key, entry] : run->ledger("tensor-parallel").entries()) {
    if (key.first != coll::CollectiveKind::kAllReduce) continue;
    const std::string_view phase(key.second);
    if (phase.starts_with("tp all-reduce")) hidden += entry.moved.sent;
    if (phase.starts_with("tp cross-entropy")) rows += entry.moved.sent;
  }
  EXPECT_EQ(hidden, uint64_t{kMicroBatches} * (4 * 2 + 1) * 1024);
  EXPECT_EQ(rows, first ? 0u : uint64_t{kMicroBatches} * 3 * 32);
  const uint64_t sent = run->ledger("pipeline").total(coll::CollectiveKind::kSend).moved.sent;
  EXPECT_EQ(sent, uint64_t{kMicroBatches} * 1024);
  strategy::AnalyticInput input = strategy::analytic_input(*run->model, world_size(), 1, kMicroBatches);
  input.rank = world_rank();
  const strategy::Prediction predicted = strategy::predict(options, input);
  uint64_t predicted_tp = 0;
  for (const strategy::PredictedTraffic& t : predicted.traffic) {
    if (t.group == "tensor-parallel") predicted_tp += t.sent;
  }
  EXPECT_EQ(predicted_tp, hidden + rows);
  if (mesh.data > 1) {  // the stage's slice: 2 blocks' matrices / 2 and their norms, its root tensors / 2
    const uint64_t owned = 2 * (kBlockMatrices / 2 + kBlockNorms) + (first ? kTable / 2 : kTable / 2 + 32);
    EXPECT_EQ(run->ledger("data-parallel").total(coll::CollectiveKind::kAllReduce).moved.sent, 4 * owned);
  }
}

// The predictor's (strategies/analytic.h) memory peaks of this rank against the run's, category by category.
strategy::Prediction expect_predicted_memory(const WorldRun& run, const strategy::StrategyOptions& options,
                                             int micro_batches) {
  strategy::AnalyticInput input = strategy::analytic_input(*run.model, world_size(), 1, micro_batches);
  input.rank = world_rank();
  strategy::Prediction predicted = strategy::predict(options, input);
  for (const Category category :
       {Category::kParameters, Category::kGradients, Category::kOptimizerState, Category::kBuckets}) {
    EXPECT_EQ(predicted.peak[category], run.device->memory().peak(category)) << category_name(category);
  }
  return predicted;
}

// FSDP2 over the stages' data-parallel groups (fsdp2 --pp 2: D = 2 at 4 ranks, 4 at 8; with --tp 2 as well, D = 1
// and 2), torch.distributed.pipelining's stage with fully_shard as torchtitan runs them. Every local tensor's rows
// divide by D: no padding. Per step, whatever the micro-batches: each of the stage's units all-gathered once (no
// resharding after forward or, until the last micro-batch, after backward) and its gradients, summed over the
// micro-batches, reduce-scattered once after the last backward, (D − 1)/D of the stage's local elements each at fp32;
// the pipeline's b·s·h·4 = 1,024 bytes per micro-batch per boundary; under TP the TP group's all-reduces as pp's
// stages make them. Memory per rank, fp32: the sharded parameters and every unit of the stage unsharded, 4·owned·
// (1 + 1/D); the unsharded gradients, accumulated in place through the step, 4·owned; Adam's m and v and foreach
// AdamW's copy over owned/D, 12·owned/D; all equal to the predictor's (fsdp2_pipeline_model.cpp).
//
// Interleaved ("-v2": --virtual-stages 2, torchtitan's Interleaved1F1B), M = 2: stage 0 runs chunks of block 1 (with
// the embedding) and block 3, stage 1 of block 2 and block 4 (with the final norm and head), each chunk an FSDP
// module. The same owned, all-gathers, reduce-scatters and parameters (both chunks unsharded at once); but a
// micro-batch crosses P·V − 1 = 3 chunk boundaries each way, so each stage sends 2V − 1 = 3 messages per micro-batch
// (stage 0: 2 activations and chunk 1's gradient; stage 1: 2 gradients and chunk 0's activation to stage 0's chunk 1).
// The gradients follow the schedule: with M = P every stage runs both backwards of chunk 1 before chunk 0's, and
// chunk 1's post-backward runs right after its own last one (REDUCE_GRAD), so chunk 1's unsharded gradients are
// reduce-scattered (leaving 4/D of them) before chunk 0's are made: stage 0 peaks at 4·block/D + 4·(block + table)
// (chunk 0's block 1 and embedding), where one module reduced at the step's end would hold 4·owned; stage 1 at the
// larger of 4·(root + block) (chunk 1: head, final norm, block 4) and 4·(root + block)/D + 4·block.
void check_fsdp2_over_stages(std::string_view name) {
  const strategy::StrategyOptions options = parallel_options(name, 2);
  const bool interleaved = options.pipeline.virtual_stages > 1;
  const auto run = run_parallel(options, kMicroBatches, 1, false);
  const strategy::Mesh mesh = strategy::mesh_of(options, world_size(), world_rank());
  const bool first = mesh.pipeline_rank() == 0;
  const uint64_t t = static_cast<uint64_t>(mesh.tensor), d = static_cast<uint64_t>(mesh.data);
  // Two of the 4 equal blocks per stage; the embedding on stage 0, the final norm and the head on stage 1.
  const uint64_t block = kBlockMatrices / t + kBlockNorms, root = first ? kTable / t : kTable / t + 32;
  const uint64_t owned = 2 * block + root;
  const coll::Ledger& data = run->ledger("data-parallel");
  const coll::LedgerEntry gathered = data.total(coll::CollectiveKind::kAllGather);
  const coll::LedgerEntry scattered = data.total(coll::CollectiveKind::kReduceScatter);
  EXPECT_EQ(gathered.moved.sent, 4 * owned * (d - 1) / d);
  EXPECT_EQ(scattered.moved.sent, 4 * owned * (d - 1) / d);
  if (d > 1) {
    EXPECT_EQ(gathered.calls, 3u);  // the root's tensors and 2 blocks, once per step
    EXPECT_EQ(scattered.calls, 3u);
  }
  const uint64_t messages = uint64_t{kMicroBatches} * (interleaved ? 3 : 1);
  const coll::LedgerEntry send = run->ledger("pipeline").total(coll::CollectiveKind::kSend);
  EXPECT_EQ(send.calls, messages);
  EXPECT_EQ(send.moved.sent, messages * 1024);
  MemoryPool& memory = run->device->memory();
  EXPECT_EQ(memory.peak(Category::kParameters), 4 * owned + 4 * owned / d);
  uint64_t gradients = 4 * owned;
  if (interleaved) {
    gradients =
        first ? 4 * block / d + 4 * (block + root) : std::max(4 * (root + block), 4 * (root + block) / d + 4 * block);
  }
  EXPECT_EQ(memory.peak(Category::kGradients), gradients);
  EXPECT_EQ(memory.peak(Category::kOptimizerState), 12 * owned / d);
  EXPECT_EQ(memory.peak(Category::kMasterWeights), 0u);
  const strategy::Prediction predicted = expect_predicted_memory(*run, options);
  for (const char* group : {"data-parallel", "pipeline", "tensor-parallel"}) {
    uint64_t want = 0, sent = 0;
    for (const strategy::PredictedTraffic& p : predicted.traffic) {
      if (p.group == group) want += p.sent;
    }
    if (std::string_view(group) != "tensor-parallel" || t > 1) sent = run->ledger(group).total().moved.sent;
    EXPECT_EQ(want, sent) << group;
  }
}

// The all-reduces of a run's "tensor-parallel" group, by phase: the [b·s, h] ones (calls), the sequence-parallel norm
// gradients' (calls and bytes sent) and the parallel cross-entropy's (bytes sent).
struct TensorAllReduces {
  uint64_t hidden = 0, norm_calls = 0, norm_sent = 0, rows = 0;
};
TensorAllReduces tensor_all_reduces(const WorldRun& run) {
  TensorAllReduces out;
  for (const auto& [key, entry] : run.ledger("tensor-parallel").entries()) {
    if (key.first != coll::CollectiveKind::kAllReduce) continue;
    const std::string_view phase(key.second);
    if (phase.starts_with("tp all-reduce, sequence-parallel norm gradients")) {
      out.norm_calls += entry.calls, out.norm_sent += entry.moved.sent;
    } else if (phase.starts_with("tp all-reduce")) {
      out.hidden += entry.calls;
    } else if (phase.starts_with("tp cross-entropy")) {
      out.rows += entry.moved.sent;
    }
  }
  return out;
}

// FSDP2 over TP 2 with sequence parallelism (torchtitan's SequenceParallel on the norms): per micro-batch the TP
// group's 4L + 2 = 18 all-reduces of b·s·h·4 = 1,024 bytes become 18 reduce-scatters and 18 all-gathers of the same
// payload, (T − 1)/T of it each, plus 2L + 1 = 9 all-gathers in backward (the saved 1/T inputs of q/k/v, gate/up and
// the head gathered again); no [b·s, h] all-reduce is left. Each norm weight's gradient (2L + 1 = 9 of h = 32 fp32,
// 128 bytes) is all-reduced over the TP group in every backward, at 2(T − 1)/T. The data-parallel group's sharding
// is unchanged. Measured = predicted per group, and for every memory category.
TEST(ParallelTraffic, Fsdp2OverSequenceParallelLayers) {
  const strategy::StrategyOptions options = parallel_options("fsdp2-tp", 2);
  model::ModelOptions model_options;
  model_options.sequence_parallel = true;
  const auto run = run_parallel(options, kMicroBatches, 1, false, false, model_options);
  constexpr uint64_t kT = 2, kM = kMicroBatches, kCalls = 4 * kLayers + 2, kNorms = 2 * kLayers + 1;
  const auto [hidden, norm_calls, norm_sent, rows] = tensor_all_reduces(*run);
  const coll::Ledger& tensor = run->ledger("tensor-parallel");
  const coll::LedgerEntry scattered = tensor.total(coll::CollectiveKind::kReduceScatter);
  const coll::LedgerEntry gathered = tensor.total(coll::CollectiveKind::kAllGather);
  EXPECT_EQ(hidden, 0u) << "no [b·s, h] all-reduce is left";
  EXPECT_EQ(scattered.calls, kM * kCalls);
  EXPECT_EQ(scattered.moved.sent, kM * kCalls * 1024 * (kT - 1) / kT);
  EXPECT_EQ(gathered.calls, kM * (kCalls + kNorms));
  EXPECT_EQ(gathered.moved.sent, kM * (kCalls + kNorms) * 1024 * (kT - 1) / kT);
  EXPECT_EQ(norm_calls, kM * kNorms);
  EXPECT_EQ(norm_sent, kM * kNorms * 2 * (kT - 1) * 128 / kT);
  const uint64_t kD = data_degree();
  const uint64_t block = kBlockMatrices / kT + kBlockNorms, root = 2 * kTable / kT + 32;
  const coll::Ledger& data = run->ledger("data-parallel");
  EXPECT_EQ(data.total(coll::CollectiveKind::kAllGather).moved.sent,
            kM * 4 * (root + 2 * kLayers * block) * (kD - 1) / kD);
  EXPECT_EQ(data.total(coll::CollectiveKind::kReduceScatter).moved.sent,
            kM * 4 * (root + kLayers * block) * (kD - 1) / kD);
  const strategy::Prediction predicted = expect_predicted_memory(*run, options);
  for (const char* group : {"data-parallel", "tensor-parallel"}) {
    for (const coll::CollectiveKind kind :
         {coll::CollectiveKind::kAllReduce, coll::CollectiveKind::kReduceScatter, coll::CollectiveKind::kAllGather}) {
      uint64_t want = 0, calls = 0;
      for (const strategy::PredictedTraffic& p : predicted.traffic) {
        if (p.group == group && p.kind == kind) want += p.sent, calls += p.calls;
      }
      const coll::LedgerEntry measured = run->ledger(group).total(kind);
      EXPECT_EQ(want, measured.moved.sent) << group << " " << static_cast<int>(kind);
      EXPECT_EQ(calls, measured.calls) << group << " " << static_cast<int>(kind);
    }
  }
}

TEST(ParallelTraffic, Fsdp2OverPipelineStages) { check_fsdp2_over_stages("fsdp2-pp"); }
TEST(ParallelTraffic, Fsdp2OverTensorParallelPipelineStages) { check_fsdp2_over_stages("fsdp2-pp-tp"); }

// The mixed recipe (MixedPrecisionPolicy param bf16, reduce fp32): each micro-batch's unsharded gradients are bf16
// and the stage keeps their fp32 sum (FSDPParam.unsharded_accumulated_grad) from the first micro-batch's backward to
// the last backward's reduce-scatter. So the gradients' peak is 4·owned of accumulators plus the bf16 gradients
// alive at once in the second micro-batch's backward: on stage 0 the embedding's (the larger than a block's, made
// after the blocks' are freed), 2·table; on stage 1 the head's and the final norm's (made when backward begins)
// beside one block's, 2·(table + 32 + block). The parameters: fp32 shards and every unit unsharded in bf16,
// 4·owned/D + 2·owned. Measured = predicted in every category.
//
// Interleaved ("-v2") with M = 4 (two rounds of P = 2 micro-batches per chunk): chunk 1's last backward now comes
// after chunk 0's first, so both chunks' fp32 accumulators are alive together before chunk 1's post-backward, and
// the same closed forms hold (on stage 0 the embedding's bf16 gradients in chunk 0's second backward, on stage 1
// the head's and final norm's beside block 4's in chunk 1's); every category equal to the predictor's, which follows
// the schedule's order of backwards.
void check_fsdp2_over_stages_mixed(std::string_view name, int micro_batches) {
  strategy::StrategyOptions options = parallel_options(name, 2);
  options.recipe = optim::precision_recipe(optim::Recipe::kMixed);
  const auto run = run_parallel(options, micro_batches, 1, false);
  const strategy::Mesh mesh = strategy::mesh_of(options, world_size(), world_rank());
  const bool first = mesh.pipeline_rank() == 0;
  const uint64_t d = static_cast<uint64_t>(mesh.data);
  const uint64_t block = kBlockMatrices + kBlockNorms;
  const uint64_t owned = 2 * block + (first ? kTable : kTable + 32);
  MemoryPool& memory = run->device->memory();
  EXPECT_EQ(memory.peak(Category::kGradients), 4 * owned + (first ? 2 * kTable : 2 * (kTable + 32 + block)));
  EXPECT_EQ(memory.peak(Category::kParameters), 4 * owned / d + 2 * owned);
  expect_predicted_memory(*run, options, micro_batches);
  const coll::Ledger& data = run->ledger("data-parallel");
  // All-gathers at bf16, reduce-scatters at fp32.
  EXPECT_EQ(data.total(coll::CollectiveKind::kAllGather).moved.sent, 2 * owned * (d - 1) / d);
  EXPECT_EQ(data.total(coll::CollectiveKind::kReduceScatter).moved.sent, 4 * owned * (d - 1) / d);
}

TEST(ParallelTraffic, Fsdp2OverPipelineStagesMixedPrecision) {
  check_fsdp2_over_stages_mixed("fsdp2-pp", kMicroBatches);
}
TEST(ParallelTraffic, Fsdp2OverInterleavedStages) { check_fsdp2_over_stages("fsdp2-pp-v2"); }
TEST(ParallelTraffic, Fsdp2OverInterleavedTensorParallelStages) { check_fsdp2_over_stages("fsdp2-pp-tp-v2"); }
TEST(ParallelTraffic, Fsdp2OverInterleavedStagesMixedPrecision) {
  check_fsdp2_over_stages_mixed("fsdp2-pp-v2", 2 * kMicroBatches);
}

// ZeRO-1 and ZeRO-2 over TP 2 in DeepSpeed's mixed recipe (bf16 parameters and gradients, fp32 master and
// moments, FusedAdam), by hand per local parameter (local = 51,488, S = local/D its partition, no padding):
//   parameters  2 bytes, every local parameter (the bf16 flat group)
//   master, m, v  4 + 8 bytes over S
//   gradients   ZeRO-2: at the step the bf16 partition (grads_in_partition, W elements: the whole local tensors
//               meeting the rank's S, in registration order), its flat copy of S and its fp32 copy, 2·W + (2 + 4)·S,
//               more than backward's partition and one tensor's .grad (2·W + 2·16,384, the embedding slice
//               [512, 32]); ZeRO-1: the larger of every unit's .grad, 2·local, alive until the one reduction at the end
//               (the partition arrives after they are all in the bucket), and the step's 2·W + 6·S
//   buckets     one ipg bucket of reduce_bucket_size = 500,000,000 bf16 elements, charged whole
// Measured = predicted in every category.
//
// W on data-parallel rank r of D: the local tensors in registration order are the embedding slice [512, 32], each
// block's q [16, 32], k and v [8, 32], o [32, 16], gate and up [32, 32], down [32, 32] and two norms [32], the final
// norm [32] and the head's slice [512, 32]; at D = 2 rank 0's S = 25,744 ends inside block 3's q_proj (+512 whole on
// both ranks).
uint64_t zero_tp_partition(uint64_t d, uint64_t r) {
  std::vector<uint64_t> order = {kTable / 2};
  for (int64_t l = 0; l < kLayers; ++l) order.insert(order.end(), {512, 256, 256, 512, 1024, 1024, 1024, 32, 32});
  order.insert(order.end(), {32, kTable / 2});
  uint64_t local = 0;
  for (const uint64_t t : order) local += t;
  return oracle::whole_tensors_meeting(order, local / d, r);
}

TEST(ParallelTraffic, ZeroOverTensorParallelMixedPrecision) {
  for (const int stage : {1, 2}) {
    SCOPED_TRACE(stage);
    strategy::StrategyOptions options = parallel_options(stage == 1 ? "zero1-tp" : "zero2-tp", 2);
    options.recipe = optim::precision_recipe(optim::Recipe::kMixed);
    const auto run = run_parallel(options, kMicroBatches, 1, false);
    const uint64_t d = data_degree();
    const uint64_t local = kLayers * (kBlockMatrices / 2 + kBlockNorms) + 2 * kTable / 2 + 32;
    const uint64_t partition = local / d;
    const uint64_t whole =
        zero_tp_partition(d, static_cast<uint64_t>(strategy::mesh_of(options, world_size(), world_rank()).data_rank()));
    MemoryPool& memory = run->device->memory();
    EXPECT_EQ(memory.peak(Category::kParameters), 2 * local);
    EXPECT_EQ(memory.peak(Category::kMasterWeights), 4 * partition);
    EXPECT_EQ(memory.peak(Category::kOptimizerState), 8 * partition);
    EXPECT_EQ(memory.peak(Category::kGradients),
              stage == 2 ? 2 * whole + (2 + 4) * partition : std::max(2 * local, 2 * whole + 6 * partition));
    EXPECT_EQ(memory.peak(Category::kBuckets), 2 * uint64_t{500'000'000});
    const strategy::Prediction predicted = expect_predicted_memory(*run, options);
    EXPECT_EQ(predicted.peak[Category::kMasterWeights], memory.peak(Category::kMasterWeights));
  }
}

// Megatron's sequence parallelism inside TP 2 × PP 2 stages (pp --tp 2 --pp 2 --sequence-parallel; fsdp2 the same in
// torchtitan's 3-D), per group, against closed forms for one step of M = 2 micro-batches. A stage runs 2 of the 4
// blocks; its b·s·h payload is 8·32·e bytes (e = 4 in fp32; 2 for fsdp2's mixed recipe, whose blocks compute in bf16).
//   tensor-parallel  per micro-batch each of the stage's 4·2 + 1 = 9 all-reduces of b·s·h (4 per block, the
//                    embedding output on the first stage, the head's input gradient on the last) becomes a
//                    reduce-scatter and an all-gather, (T − 1)/T of the payload each; 2 all-gathers more per block
//                    and 1 more on the last stage (the saved inputs of q/k/v, gate/up and the head gathered again
//                    in backward): 9 reduce-scatters, 13 all-gathers on the first stage and 14 on the last. No
//                    [b·s, h] all-reduce is left. Once per step the stage's norm weights' gradients (2 per block, the
//                    final norm on the last stage: 4 or 5 of h = 32 fp32) are summed over the group, 2(T − 1)/T = 1
//                    times their bytes: pp in one call (Megatron's finalize_model_grads), fsdp2 one call per norm
//                    weight at its stage's last backward (FSDP2's Partial gradient made Replicate, in the mixed recipe
//                    from the fp32 accumulator). The last stage's cross-entropy: 3 of b·s·4 = 32 bytes.
//   pipeline         each TP rank sends its b·s/T rows: M sends of 8·32·e/2 bytes per stage (Megatron's
//                    get_tensor_shapes divides the sequence by T under --sequence-parallel).
// Measured = predicted per group and kind (calls and bytes; pp's predictor leaves out the scalar sums of the gradient
// norm and the reported loss, fsdp2's counts them) and for every memory category the predictor gives.
void check_sequence_parallel_stages(std::string_view name, optim::Recipe recipe) {
  strategy::StrategyOptions options = parallel_options(name, 2);
  options.recipe = optim::precision_recipe(recipe);
  model::ModelOptions model_options;
  model_options.sequence_parallel = true;
  const auto run = run_parallel(options, kMicroBatches, 1, false, false, model_options);
  const strategy::Mesh mesh = strategy::mesh_of(options, world_size(), world_rank());
  const bool last = mesh.pipeline_rank() == 1;
  const bool fsdp2 = name.starts_with("fsdp2");
  constexpr uint64_t kT = 2, kM = kMicroBatches;
  const uint64_t e = recipe == optim::Recipe::kFp32 ? 4 : 2, payload = 8 * 32 * e;
  const uint64_t norms = 2 * 2 + (last ? 1 : 0);
  const auto [hidden, norm_calls, norm_sent, rows] = tensor_all_reduces(*run);
  const coll::Ledger& tensor = run->ledger("tensor-parallel");
  const coll::LedgerEntry scattered = tensor.total(coll::CollectiveKind::kReduceScatter);
  const coll::LedgerEntry gathered = tensor.total(coll::CollectiveKind::kAllGather);
  EXPECT_EQ(hidden, 0u) << "no [b·s, h] all-reduce is left";
  EXPECT_EQ(scattered.calls, kM * 9);
  EXPECT_EQ(scattered.moved.sent, kM * 9 * payload * (kT - 1) / kT);
  EXPECT_EQ(gathered.calls, kM * (last ? 14 : 13));
  EXPECT_EQ(gathered.moved.sent, kM * (last ? 14 : 13) * payload * (kT - 1) / kT);
  EXPECT_EQ(norm_calls, fsdp2 ? norms : 1);
  EXPECT_EQ(norm_sent, norms * 32 * 4 * 2 * (kT - 1) / kT);
  EXPECT_EQ(rows, last ? kM * 3 * 32 : 0u);
  const coll::LedgerEntry send = run->ledger("pipeline").total(coll::CollectiveKind::kSend);
  EXPECT_EQ(send.calls, kM);
  EXPECT_EQ(send.moved.sent, kM * payload / kT);
  const strategy::Prediction predicted = expect_predicted_memory(*run, options);
  for (const char* group : {"tensor-parallel", "pipeline"}) {
    for (const coll::CollectiveKind kind : {coll::CollectiveKind::kAllReduce, coll::CollectiveKind::kReduceScatter,
                                            coll::CollectiveKind::kAllGather, coll::CollectiveKind::kSend}) {
      uint64_t want = 0, calls = 0;
      for (const strategy::PredictedTraffic& p : predicted.traffic) {
        if (p.group == group && p.kind == kind) want += p.sent, calls += p.calls;
      }
      uint64_t sent = 0, made = 0;
      for (const auto& [key, entry] : run->ledger(group).entries()) {
        const std::string_view phase(key.second);
        if (key.first != kind || (!fsdp2 && (phase == "gradient norm" || phase == "pipeline loss (reporting)"))) {
          continue;
        }
        sent += entry.moved.sent, made += entry.calls;
      }
      EXPECT_EQ(want, sent) << group << " " << static_cast<int>(kind);
      EXPECT_EQ(calls, made) << group << " " << static_cast<int>(kind);
    }
  }
}

TEST(ParallelTraffic, SequenceParallelPipelineStages) { check_sequence_parallel_stages("pp-tp", optim::Recipe::kFp32); }
TEST(ParallelTraffic, SequenceParallelFsdp2Stages) {
  check_sequence_parallel_stages("fsdp2-pp-tp", optim::Recipe::kFp32);
}
TEST(ParallelTraffic, SequenceParallelFsdp2StagesMixedPrecision) {
  check_sequence_parallel_stages("fsdp2-pp-tp", optim::Recipe::kMixed);
}

// The activations a sequence-parallel stage keeps per micro-batch in flight (pp --tp 2 --pp 2 --sequence-parallel,
// fp32, SDPA), by hand, bytes, T = b·s = 8, h = 32, T/t = 4 rows:
//   a block (tests/mpi/strategy_tensor_test.cpp, SavedPerBlock): the norm region on T/t rows, 6,208/2 = 3,104; q and
//     the attention output 2·4·T·32/2 = 1,024, k and v 2·4·T·16/2 = 512, gate, silu(gate), up and their product
//     4·4·T·64/2 = 4,096; SDPA's logsumexp 4·(a/t)·32 = 512                                            = 9,248
//   the first stage: 2 blocks and the token ids (T int32, 32)                                          = 18,528
//   the last stage: 2 blocks, the last block's output on T/t rows (4·4·32 = 512), the final norm's rstd (4·4 = 16),
//     normalised tensor (512) and output (512), the fp32 log-softmax of the rank's vocabulary half
//     (4·T·512 = 16,384)                                                                                = 36,432
// Against single-stage pp --tp 2 this is Korthikanti et al.'s split with sequence parallelism: every norm-region term
// (and the stage's input, the first block's saved input) 1/t. GPipe holds all M micro-batches; 1F1B min(P − s, M):
// 2 on the first stage, 1 on the last. Runs of M = 4 and M = 1 differ by (in flight − 1) micro-batches exactly.
class SequenceParallelActivations : public ::testing::TestWithParam<strategy::Schedule> {};

TEST_P(SequenceParallelActivations, InFlightPerStageByHand) {
  strategy::StrategyOptions options = parallel_options("pp-tp", 2);
  options.pipeline.schedule = GetParam();
  model::ModelOptions model_options;
  model_options.sequence_parallel = true;
  const auto one = run_parallel(options, 1, 1, false, false, model_options);
  const auto four = run_parallel(options, 4, 1, false, false, model_options);
  const int stage = strategy::mesh_of(options, world_size(), world_rank()).pipeline_rank();
  const uint64_t per_micro_batch = stage == 0 ? 18528 : 36432;
  const uint64_t in_flight = GetParam() == strategy::Schedule::kGpipe ? 4 : 2 - static_cast<uint64_t>(stage);
  EXPECT_EQ(four->device->memory().peak(Category::kActivations) - one->device->memory().peak(Category::kActivations),
            (in_flight - 1) * per_micro_batch)
      << "stage " << stage << ": " << in_flight << " micro-batches in flight";
  // One micro-batch in flight: the stage's whole activation peak is its own closed form (memory_terms.h), the
  // received input being the first block's saved input.
  model_options.compute = DType::kF32;
  const uint64_t blocks = 2 * model::saved_activation_bytes_per_block(one->model->config(), model_options, 2);
  EXPECT_EQ(blocks, 2 * 9248u);
}

INSTANTIATE_TEST_SUITE_P(Schedules, SequenceParallelActivations,
                         ::testing::Values(strategy::Schedule::kGpipe, strategy::Schedule::k1F1B),
                         [](const ::testing::TestParamInfo<strategy::Schedule>& param) {
                           return param.param == strategy::Schedule::kGpipe ? std::string("gpipe")
                                                                            : std::string("one_f_one_b");
                         });

// N not divisible by T·P: a clear error naming the values, the same on every rank.
TEST(ParallelLayout, IndivisibleWorldRefused) {
  strategy::StrategyOptions options = parallel_options("tp", 3);
  try {
    strategy::mesh_of(options, 4, 0);
    FAIL() << "4 ranks over tp 3 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("4 ranks are not divisible by tensor-parallel 3"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(strategy::mesh_of(parallel_options("pp", 2), 8, 5).data_rank(), 2);
  EXPECT_EQ(strategy::mesh_of(parallel_options("pp", 2), 8, 5).pipeline_rank(), 1);
}

}  // namespace
}  // namespace emu::testing
