// Tensor parallelism (tp, strategies/tensor_parallel.cpp) with the world as one TP group of t = N ranks, on a
// Llama made to split: h = 32, a = 8 heads of d = 4, kv = 4 heads (8 at t = 8), F = 64, V = 1024 (a multiple of
// Megatron's 128·t for every t ≤ 8, so the vocabulary needs no padding and the model is the single device's), s = 8,
// b = 1, in the fp32 recipe. Checked: the same losses, gradient norms and weights as single-device training on the
// same global batch; the all-reduces of a step against Megatron's count and the ring's 2(t − 1)/t; the model states
// and the per-block activations of a rank by hand. The same with Megatron's sequence parallelism (s = 8 divides by
// every t ≤ 8) and selective recomputation. And GPT-2 as Megatron splits it (tensor_parallel.h): a GPT-2 of h = 32,
// a = 8 heads of d = 4, F = 128, V = 1024, s = 8 learned positions, its head tied to wte.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string_view>

#include "strategies/analytic.h"
#include "tests/mpi/strategy_harness.h"
#include "workloads/model/memory_terms.h"

namespace emu::testing {
namespace {

constexpr int kSteps = 3;
constexpr int kAccumulation = 2;

model::ModelConfig tp_config(int64_t layers = 2, bool tied = false) {
  model::ModelConfig config = tiny_config(model::Style::kLlama, 1, layers);
  config.hidden = 32;
  config.heads = 8;
  config.kv_heads = world_size() == 8 ? 8 : 4;
  config.ffn = 64;
  config.vocab = 1024;
  config.tie_embeddings = tied;
  return config;
}

// GPT-2 made to split as tp_config's Llama: c_attn [32, 96] into q, k and v blocks of a/t heads, c_fc [32, 128].
model::ModelConfig gpt2_tp_config(int64_t layers = 2) {
  model::ModelConfig config = tiny_config(model::Style::kGpt2, 1, layers);
  config.hidden = 32;
  config.heads = 8;
  config.kv_heads = 8;
  config.ffn = 128;
  config.vocab = 1024;
  return config;
}

// Every rank runs the same `accumulation` micro-batches of one sequence each per step: the global batch of the
// single-device reference with N = 1 (run_reference_config).
std::unique_ptr<WorldRun> run_tp(const model::ModelConfig& config, const strategy::StrategyOptions& options,
                                 int accumulation, int steps, bool weights_every_step,
                                 const model::ModelOptions& model_options = {}) {
  auto run = set_up_on_world(config, options, model_options);
  const auto data = tiny_data(config);
  for (int step = 0; step < steps; ++step) {
    std::vector<data::Batch> batches;
    batches.reserve(static_cast<size_t>(accumulation));
    for (int m = 0; m < accumulation; ++m) batches.push_back(data.batch(step, m, 1));
    const strategy::StepResult result = run->strategy->step(batches);
    record_step(run->trace, result.loss, result, *run->strategy, run->model->num_units(), weights_every_step);
  }
  return run;
}

// fp32: each rank computes its heads' and FFN rows' part with the same fp32 ops as the reference; only the order of
// the sums differs (the row-parallel products summed over t ranks, Σexp over the vocabulary slices): a few ulps,
// seen ≤ 1e-6 relative on losses and norms and ≤ 1e-6 on weights. A missing all-reduce changes every number at
// its first step; a missing 1/N (the gradients of the replicated norms summed over the ranks, or counted t times
// in the norm) moves the gradient norm by far more than 1e-5 and the weights by up to lr = 1e-2 at once.
constexpr double kLossTolerance = 1e-5, kNormTolerance = 1e-5, kWeightTolerance = 1e-5;

struct Variant {
  const char* name;
  bool tied = false, sequence_parallel = false, selective = false, checkpoint = false, gpt2 = false;
};

void PrintTo(const Variant& variant, std::ostream* out) { *out << variant.name; }

class Equivalence : public ::testing::TestWithParam<Variant> {};

// Sequence parallelism changes where the norms run and which collectives carry the sums, not the numbers: the same
// tolerances. A norm weight's gradient not all-reduced under it (each rank's rows only) moves the gradient norm and
// the norm weights at the first step; an all-gather skipped in backward leaves t − 1 of the t row blocks of a
// gradient unset. GPT-2: a row-parallel bias added on every rank before the all-reduce (t times), wpe added before
// the embedding's all-reduce, or c_attn split into contiguous thirds instead of q, k and v head blocks change the
// loss at the first step; a replicated tensor (LayerNorms, c_proj biases, wpe) counted t times moves the norm.
TEST_P(Equivalence, SameAsSingleDevice) {
  const Variant variant = GetParam();
  const model::ModelConfig config = variant.gpt2 ? gpt2_tp_config() : tp_config(2, variant.tied);
  strategy::StrategyOptions options = test_options("tp", optim::Recipe::kFp32);
  const Trace reference = run_reference_config(config, options, 1, kAccumulation, kSteps);
  model::ModelOptions model_options;
  model_options.sequence_parallel = variant.sequence_parallel;
  model_options.selective_recompute = variant.selective;
  model_options.checkpoint = variant.checkpoint;
  const auto run = run_tp(config, options, kAccumulation, kSteps, true, model_options);
  for (int step = 0; step < kSteps; ++step) {
    const size_t i = static_cast<size_t>(step);
    EXPECT_NEAR(run->trace.losses[i], reference.losses[i], kLossTolerance * std::abs(reference.losses[i]))
        << "step " << step + 1;
    EXPECT_NEAR(run->trace.grad_norms[i], reference.grad_norms[i], kNormTolerance * reference.grad_norms[i])
        << "step " << step + 1;
    EXPECT_LE(worst_weight_error(run->trace, reference, i).worst, kWeightTolerance) << "step " << step + 1;
    // Every rank reports the same loss (the parallel cross-entropy's statistics are the group's).
    float low = run->trace.losses[i], high = low;
    MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(low, high) << "step " << step + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, Equivalence,
                         ::testing::Values(Variant{"untied"}, Variant{"tied", true},
                                           Variant{"sequence_parallel", false, true},
                                           Variant{"sequence_parallel_tied", true, true},
                                           Variant{"sequence_parallel_selective", false, true, true},
                                           Variant{"sequence_parallel_checkpointed", false, true, false, true},
                                           Variant{"selective", false, false, true},
                                           Variant{"gpt2", true, false, false, false, true},
                                           Variant{"gpt2_checkpointed", true, false, false, true, true},
                                           Variant{"gpt2_selective", true, false, true, false, true}),
                         [](const ::testing::TestParamInfo<Variant>& param) { return param.param.name; });

// Megatron's all-reduces for one step of M = 2 micro-batches over L = 2 blocks, written out: per micro-batch, in
// forward one after each block's o_proj and one after its down_proj plus one of the embedding output; in backward
// one of each block's q/k/v input gradient and one of its gate/up input gradient plus one of the LM head's input
// gradient: 4L + 2 = 10 of b·s·h·4 = 8·32·4 = 1,024 bytes; and the parallel cross-entropy's 3 of b·s·4 = 32 bytes.
// A ring all-reduce sends 2(t − 1)/t of its payload from every rank.
// One step of M = 2 micro-batches of `config` under tp: its [b·s, h] all-reduces against 10 per micro-batch of
// `hidden_bytes` and the cross-entropy's 3 of 32 bytes, and the predictor against the ledger.
void expect_all_reduces_per_step(const model::ModelConfig& config, uint64_t hidden_bytes) {
  const int t = world_size();  // t = 1: the calls are made, nothing crosses the wire
  constexpr int kMicroBatches = 2;
  const strategy::StrategyOptions options = test_options("tp", optim::Recipe::kFp32);
  const auto run = run_tp(config, options, kMicroBatches, 1, false);
  uint64_t hidden_calls = 0, hidden_sent = 0, row_calls = 0, row_sent = 0;
  for (const auto& [key, entry] : run->world->ledger().entries()) {
    if (key.first != coll::CollectiveKind::kAllReduce) continue;
    const std::string_view phase(key.second);
    if (phase.starts_with("tp all-reduce")) hidden_calls += entry.calls, hidden_sent += entry.moved.sent;
    if (phase.starts_with("tp cross-entropy")) row_calls += entry.calls, row_sent += entry.moved.sent;
  }
  const uint64_t ring = 2 * static_cast<uint64_t>(t - 1);  // × payload / t
  EXPECT_EQ(hidden_calls, uint64_t{kMicroBatches} * (4 * 2 + 2));
  EXPECT_EQ(hidden_sent, uint64_t{kMicroBatches} * 10 * ring * hidden_bytes / static_cast<uint64_t>(t));
  EXPECT_EQ(row_calls, uint64_t{kMicroBatches} * 3);
  EXPECT_EQ(row_sent, uint64_t{kMicroBatches} * 3 * ring * 32 / static_cast<uint64_t>(t));
  // The predictor (strategies/tp_model.cpp) says the same.
  const strategy::Prediction predicted =
      strategy::predict(options, strategy::analytic_input(*run->model, t, 1, kMicroBatches));
  EXPECT_EQ(predicted.sent(coll::CollectiveKind::kAllReduce), hidden_sent + row_sent);
}

TEST(TpTraffic, AllReducesPerStep) { expect_all_reduces_per_step(tp_config(), 1024); }

// GPT-2 as Megatron's GPT, the same step of M = 2 over L = 2 blocks: per micro-batch, in forward one all-reduce
// after each block's attn.c_proj and one after its mlp.c_proj (their biases added after them, no traffic) plus one
// of the embedding output (wpe added after it, no traffic); in backward one of each block's c_attn input gradient
// and one of its c_fc input gradient plus one of the tied head's input gradient: 4L + 2 = 10 of b·s·h·4 =
// 8·32·4 = 1,024 bytes, and the cross-entropy's 3 of 32 bytes. The replicated tensors' gradients (LayerNorms,
// c_proj biases, wpe) are equal on every rank: no reduction.
TEST(TpTraffic, Gpt2AllReducesPerStep) { expect_all_reduces_per_step(gpt2_tp_config(), 1024); }

// Sequence parallelism (Korthikanti et al. 2022 §4.2.2; Megatron mappings.py, layers.py), the same step of M = 2
// micro-batches over L = 2 blocks, written out per micro-batch:
//   forward   reduce-scatters: the embedding output, each block's o_proj and down_proj outputs          2L + 1 = 5
//             all-gathers: each block's two norm outputs (q/k/v, gate/up inputs), the final norm output  2L + 1 = 5
//   backward  all-gathers: each block's output gradient before down_proj and its residual-after-attention
//             gradient before o_proj, the embedding output's gradient (the reduce-scatters' backward)    2L + 1 = 5
//             and the saved norm-output slices again for the weight gradients (2 per block, the head)    2L + 1 = 5
//             reduce-scatters: the q/k/v and gate/up input gradients, the head's input gradient          2L + 1 = 5
// each of b·s·h·4 = 1,024 bytes, a ring sending (t − 1)/t of it. So every all-reduce of the run without it became
// one reduce-scatter and one all-gather of the same payload, moving the same 2(t − 1)/t, and 2L + 1 all-gathers
// come on top. Per step, the norm weights' gradients ((2L + 1)·h = 160 fp32, 640 bytes) are all-reduced once.
TEST(TpTraffic, SequenceParallelReduceScattersAndAllGathersPerStep) {
  const int t = world_size();
  constexpr int kMicroBatches = 2;
  const model::ModelConfig config = tp_config();
  const strategy::StrategyOptions options = test_options("tp", optim::Recipe::kFp32);
  model::ModelOptions model_options;
  model_options.sequence_parallel = true;
  const auto run = run_tp(config, options, kMicroBatches, 1, false, model_options);
  uint64_t scatter_calls = 0, scatter_sent = 0, gather_calls = 0, gather_sent = 0, hidden_calls = 0, norm_calls = 0,
           norm_sent = 0;
  for (const auto& [key, entry] : run->world->ledger().entries()) {
    const std::string_view phase(key.second);
    if (key.first == coll::CollectiveKind::kReduceScatter && phase.starts_with("tp reduce-scatter")) {
      scatter_calls += entry.calls, scatter_sent += entry.moved.sent;
    }
    if (key.first == coll::CollectiveKind::kAllGather && phase.starts_with("tp all-gather")) {
      gather_calls += entry.calls, gather_sent += entry.moved.sent;
    }
    if (key.first != coll::CollectiveKind::kAllReduce) continue;
    if (phase.starts_with("tp all-reduce, sequence-parallel norm gradients")) {
      norm_calls += entry.calls, norm_sent += entry.moved.sent;
    } else if (phase.starts_with("tp all-reduce")) {
      hidden_calls += entry.calls;
    }
  }
  const uint64_t tm1 = static_cast<uint64_t>(t - 1), tt = static_cast<uint64_t>(t);
  EXPECT_EQ(hidden_calls, 0u) << "no [b·s, h] all-reduce is left";
  EXPECT_EQ(scatter_calls, uint64_t{kMicroBatches} * 10);
  EXPECT_EQ(gather_calls, uint64_t{kMicroBatches} * 15);
  EXPECT_EQ(scatter_sent, uint64_t{kMicroBatches} * 10 * tm1 * 1024 / tt);
  EXPECT_EQ(gather_sent, uint64_t{kMicroBatches} * 15 * tm1 * 1024 / tt);
  // What the all-reduces sent without it, (4L + 2) × 2(t − 1)/t × 1,024 per micro-batch, plus the re-gathers.
  EXPECT_EQ(scatter_sent + gather_sent, uint64_t{kMicroBatches} * (10 * 2 * tm1 * 1024 / tt + 5 * tm1 * 1024 / tt));
  EXPECT_EQ(norm_calls, t > 1 ? 1u : 0u);
  EXPECT_EQ(norm_sent, 2 * tm1 * 640 / tt);
  // The predictor (strategies/tp_model.cpp) says the same.
  const strategy::Prediction predicted =
      strategy::predict(options, strategy::analytic_input(*run->model, t, 1, kMicroBatches));
  EXPECT_EQ(predicted.sent(coll::CollectiveKind::kReduceScatter), scatter_sent);
  EXPECT_EQ(predicted.sent(coll::CollectiveKind::kAllGather), gather_sent);
  EXPECT_EQ(predicted.sent(coll::CollectiveKind::kAllReduce),
            norm_sent + uint64_t{kMicroBatches} * 3 * 2 * tm1 * 32 / tt);
}

// A rank's model states by hand, fp32 recipe (parameters 4, gradients 4, Adam m and v 8 bytes per parameter it
// holds). Full shapes: a block's matrices q 32·32, k and v kvd·32 (kvd = kv·4), o 32·32, gate, up, down 64·32
// each, split over t; its two norms (32 each) whole. The root: embedding and head 1024·32 each, split by
// vocabulary rows; the final norm (32) whole.
TEST(TpMemory, ModelStatesByHand) {
  const int t = world_size();
  const model::ModelConfig config = tp_config();
  const auto run = run_tp(config, test_options("tp", optim::Recipe::kFp32), 1, 1, false);
  const uint64_t kvd = static_cast<uint64_t>(config.kv_heads) * 4;
  const uint64_t block = 32 * 32 + 2 * kvd * 32 + 32 * 32 + 3 * 64 * 32;
  const uint64_t local = (2 * block + 2 * 1024 * 32) / static_cast<uint64_t>(t) + 2 * 2 * 32 + 32;
  MemoryPool& memory = run->device->memory();
  EXPECT_EQ(memory.peak(Category::kParameters), 4 * local);
  EXPECT_EQ(memory.peak(Category::kGradients), 4 * local);
  EXPECT_EQ(memory.peak(Category::kOptimizerState), 8 * local);
}

// GPT-2's model states by hand, fp32 recipe (4 + 4 + 8 bytes per parameter held). Full shapes, Conv1D [in, out]:
// a block's c_attn 32·96 and its bias 96, c_fc 32·128 and its bias 128, attn.c_proj 32·32, mlp.c_proj 128·32, all
// split over t; whole on every rank: ln_1 and ln_2 (weight and bias, 4·32) and the two c_proj biases (2·32). The
// root: wte 1024·32 split by vocabulary rows (the tied head), wpe 8·32 and ln_f (2·32) whole. The predictor
// (strategies/tp_model.cpp) agrees with what was measured.
TEST(TpMemory, Gpt2ModelStatesByHand) {
  const int t = world_size();
  const strategy::StrategyOptions options = test_options("tp", optim::Recipe::kFp32);
  const auto run = run_tp(gpt2_tp_config(), options, 1, 1, false);
  const uint64_t split_block = 32 * 96 + 96 + 32 * 128 + 128 + 32 * 32 + 128 * 32;
  const uint64_t whole_block = 4 * 32 + 2 * 32;
  const uint64_t local = (2 * split_block + 1024 * 32) / static_cast<uint64_t>(t) + 2 * whole_block + 8 * 32 + 2 * 32;
  MemoryPool& memory = run->device->memory();
  EXPECT_EQ(memory.peak(Category::kParameters), 4 * local);
  EXPECT_EQ(memory.peak(Category::kGradients), 4 * local);
  EXPECT_EQ(memory.peak(Category::kOptimizerState), 8 * local);
  const strategy::Prediction predicted = strategy::predict(options, strategy::analytic_input(*run->model, t, 1, 1));
  for (const Category category : {Category::kParameters, Category::kGradients, Category::kOptimizerState}) {
    EXPECT_EQ(predicted.peak[category], memory.peak(category)) << category_name(category);
  }
}

// The activations one GPT-2 block saves on a rank, as ActivationsPerBlockByHand below: Hugging Face's GPT-2 block in
// fp32 with SDPA, T = 8, h = 32, bytes:
//   whole on every rank: the block input, ln_1's output, the residual after attention, ln_2's output 4·4·T·h, the
//     two LayerNorms' mean and rstd 2·2·4·T                                                 = 4,096 + 128 = 4,224
//   split over t: qkv and the attention output 4·4·T·32, c_fc's output and gelu_new's four 5·4·T·128, SDPA's
//     logsumexp 4·b·(a/t)·32                                                   = (4,096 + 20,480 + 1,024)/t
// Korthikanti et al. 2022 (Eq. 2) split the same tensors: the LayerNorm inputs whole, qkv, attention and the MLP's
// 4h intermediates 1/t.
TEST(TpMemory, Gpt2ActivationsPerBlockByHand) {
  const int t = world_size();
  const strategy::StrategyOptions options = test_options("tp", optim::Recipe::kFp32);
  const auto two = run_tp(gpt2_tp_config(2), options, 1, 1, false);
  const auto four = run_tp(gpt2_tp_config(4), options, 1, 1, false);
  const uint64_t measured =
      four->device->memory().peak(Category::kActivations) - two->device->memory().peak(Category::kActivations);
  const uint64_t per_block = 4224 + (4096 + 20480 + 1024) / static_cast<uint64_t>(t);
  EXPECT_EQ(measured, 2 * per_block) << "t = " << t;
  model::ModelOptions model_options;
  model_options.compute = DType::kF32;
  EXPECT_EQ(per_block, model::saved_activation_bytes_per_block(two->model->config(), model_options, 1));
}

// The activations one block saves on a rank, from two runs of 2 and 4 blocks (their activation peaks, at the end
// of forward, differ by two blocks' saved tensors). By hand, Hugging Face's Llama block in fp32 with SDPA
// (model/blocks.h), T = b·s = 8 tokens, bytes:
//   whole on every rank (the residual stream and the norms are not split without sequence parallelism):
//     block input and residual after attention 2·4·T·h, each norm's normalised tensor and output 4·4·T·h,
//     each norm's rstd 2·4·T                                                   = 2,048 + 4,096 + 64 = 6,208
//   split over t: q and the attention output 2·4·T·32, k and v 2·4·T·kvd, gate, silu(gate), up and their
//     product 4·4·T·64, and SDPA's logsumexp 4·b·(a/t)·32 (rows padded to 32 in fp32)
//                                                                    = (2,048 + 64·kvd + 8,192 + 1,024)/t
// Korthikanti et al. 2022 (Eq. 2, no sequence parallelism, no recomputation) count sbh(10 + 24/t + 5as/(ht)) at
// 2 bytes for GPT: where the tensors are the same, the split is the same (q/k/v and attention output, MLP
// intermediates, the attention scores all 1/t; the norm inputs and the linear layers' inputs whole). The
// differences, by name: emu keeps Hugging Face's RMSNorm tensors (normalised tensor and output beside the input,
// 3 per norm, not 1); SwiGLU keeps four [T, F] tensors where GPT's GELU keeps two of 4h; grouped-query k and v are
// kvd wide, not h; SDPA keeps the logsumexp instead of the 5as/(ht) score, softmax and dropout tensors; Llama has
// no dropout masks (Korthikanti's 2sbh of the 10).
TEST(TpMemory, ActivationsPerBlockByHand) {
  const int t = world_size();
  const strategy::StrategyOptions options = test_options("tp", optim::Recipe::kFp32);
  const uint64_t two = run_tp(tp_config(2), options, 1, 1, false)->device->memory().peak(Category::kActivations);
  const uint64_t four = run_tp(tp_config(4), options, 1, 1, false)->device->memory().peak(Category::kActivations);
  const uint64_t kvd = static_cast<uint64_t>(tp_config().kv_heads) * 4;
  const uint64_t per_block = 6208 + (2048 + 64 * kvd + 8192 + 1024) / static_cast<uint64_t>(t);
  EXPECT_EQ(four - two, 2 * per_block) << "t = " << t;
}

}  // namespace
}  // namespace emu::testing

namespace emu::testing {
namespace {

// The activations one block saves on a rank with sequence parallelism and selective recomputation, from the same
// two runs of 2 and 4 blocks as above. emu's block (Hugging Face's Llama in fp32, SDPA or eager), bytes, T = 8, h = 32:
//   the norm region, T/t rows under sequence parallelism: the block input and the residual after attention
//     (2·4·T·h = 2,048: each norm's saved fp32 input), each norm's normalised tensor and output (4·4·T·h = 4,096),
//     each norm's rstd (2·4·T = 64)                                                          = 6,208 / t
//   between the column- and row-parallel layers, 1/t by the heads and the FFN split: q and the attention output
//     (2·4·T·32 = 2,048), k and v (2·4·T·kvd; eager under grouped-query attention repeat_kv's copies, kvd → 32),
//     gate, silu(gate), up and their product (4·4·T·64 = 8,192)
//   the attention scores' terms: SDPA's logsumexp 4·b·(a/t)·32 = 1,024/t (rows padded to 32 in fp32), eager's fp32
//     softmax 4·b·(a/t)·s² = 2,048/t; 0 under selective recomputation
// So sequence parallelism divides exactly the norm-region terms by t, selective recomputation removes exactly the
// score terms, and with both every saved byte is 1/t of the single device's (Korthikanti's sbh·34/t for GPT).
struct Saved {
  bool sequence_parallel, selective;
  model::Attention attention;
};

void PrintTo(const Saved& saved, std::ostream* out) {
  *out << (saved.sequence_parallel ? "sp " : "") << (saved.selective ? "selective " : "")
       << (saved.attention == model::Attention::kEager ? "eager" : "sdpa");
}

uint64_t per_block_by_hand(const Saved& saved, int t) {
  const uint64_t tt = static_cast<uint64_t>(t);
  const bool eager = saved.attention == model::Attention::kEager;
  const uint64_t kv = static_cast<uint64_t>(tp_config().kv_heads) * 4;
  const uint64_t kvd = eager && kv < 32 ? 32 : kv;
  const uint64_t norms = saved.sequence_parallel ? 6208 / tt : 6208;
  const uint64_t scores = saved.selective ? 0 : (eager ? 2048 : 1024) / tt;
  return norms + (2048 + 64 * kvd + 8192) / tt + scores;
}

class SavedPerBlock : public ::testing::TestWithParam<Saved> {};

TEST_P(SavedPerBlock, ByHand) {
  const int t = world_size();
  const Saved saved = GetParam();
  const strategy::StrategyOptions options = test_options("tp", optim::Recipe::kFp32);
  model::ModelOptions model_options;
  model_options.sequence_parallel = saved.sequence_parallel;
  model_options.selective_recompute = saved.selective;
  model_options.attention = saved.attention;
  const auto two = run_tp(tp_config(2), options, 1, 1, false, model_options);
  const auto four = run_tp(tp_config(4), options, 1, 1, false, model_options);
  const uint64_t measured =
      four->device->memory().peak(Category::kActivations) - two->device->memory().peak(Category::kActivations);
  EXPECT_EQ(measured, 2 * per_block_by_hand(saved, t)) << "t = " << t;
  // The model's closed form (memory_terms.h), what the report prints, agrees.
  model_options.compute = DType::kF32;
  EXPECT_EQ(measured / 2, model::saved_activation_bytes_per_block(two->model->config(), model_options,
                                                                  saved.sequence_parallel ? t : 1));
}

INSTANTIATE_TEST_SUITE_P(
    Tp, SavedPerBlock,
    ::testing::Values(Saved{true, false, model::Attention::kSdpa}, Saved{false, true, model::Attention::kSdpa},
                      Saved{true, true, model::Attention::kSdpa}, Saved{false, true, model::Attention::kEager},
                      Saved{true, true, model::Attention::kEager}, Saved{false, false, model::Attention::kEager}),
    [](const ::testing::TestParamInfo<Saved>& param) {
      return fmt::format("{}{}{}", param.param.sequence_parallel ? "sp_" : "",
                         param.param.selective ? "selective_" : "",
                         param.param.attention == model::Attention::kEager ? "eager" : "sdpa");
    });

}  // namespace
}  // namespace emu::testing
