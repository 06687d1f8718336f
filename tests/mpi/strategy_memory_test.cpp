// Memory and traffic: each strategy's measured per-rank peaks by model-state category equal the analytic model to
// the byte, and each step's traffic by collective kind matches the ZeRO-paper volumes.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "strategies/analytic.h"
#include "tests/mpi/strategy_harness.h"

namespace emu::testing {
namespace {

constexpr Category kModelStateCategories[] = {Category::kParameters, Category::kGradients, Category::kMasterWeights,
                                              Category::kOptimizerState, Category::kBuckets};

struct Case {
  std::string strategy;
  optim::Recipe recipe;
  std::string variant;  // a knob turned away from its default, or empty
  void (*tweak)(strategy::StrategyOptions&) = nullptr;
  friend void PrintTo(const Case& c, std::ostream* os) {
    *os << c.strategy << (c.recipe == optim::Recipe::kFp32 ? "/fp32" : "/mixed") << "/" << c.variant;
  }
};

strategy::StrategyOptions memory_options(const Case& c) {
  strategy::StrategyOptions options = test_options(c.strategy, c.recipe);
  // Full-scale DDP buckets and DeepSpeed sizes divided by 32^2: buckets of a few KiB, so the tiny model has
  // several of them, and a ZeRO-3 persistence threshold (97 elements) below every unit.
  options.shrink = 32;
  if (c.tweak != nullptr) c.tweak(options);
  return options;
}

strategy::AnalyticInput analytic_input(const model::Model& model, int accumulation) {
  strategy::AnalyticInput input = strategy::analytic_input(model, world_size(), test_ranks_per_node(), accumulation);
  input.rank = world_rank();  // ZeroRedundancyOptimizer's ranks own different tensors
  return input;
}

class MemoryAndTraffic : public ::testing::TestWithParam<Case> {};

TEST_P(MemoryAndTraffic, MeasuredEqualsAnalytic) {
  const strategy::StrategyOptions options = memory_options(GetParam());
  constexpr int kAccumulation = 2;
  auto run = run_strategy(model::Style::kLlama, options, kAccumulation, /*steps=*/1);
  const strategy::Prediction predicted = strategy::predict(options, analytic_input(*run->model, kAccumulation));
  const MemoryPool& memory = run->device->memory();
  for (Category category : kModelStateCategories) {
    EXPECT_EQ(memory.peak(category), predicted.peak[category]) << category_name(category);
  }

  // Traffic of one step, summed over the groups the strategy uses.
  std::map<coll::CollectiveKind, uint64_t> sent;
  for (coll::Communicator* group : run->strategy->groups()) {
    for (const auto& [key, entry] : group->ledger().entries()) {
      EXPECT_EQ(entry.moved, entry.expected) << group->name() << " " << coll::kind_name(key.first) << " " << key.second;
      sent[key.first] += entry.moved.sent;
    }
  }
  for (coll::CollectiveKind kind : {coll::CollectiveKind::kAllReduce, coll::CollectiveKind::kReduceScatter,
                                    coll::CollectiveKind::kAllGather, coll::CollectiveKind::kReduce}) {
    const double want = static_cast<double>(predicted.sent(kind));
    const double got = static_cast<double>(sent[kind]);
    // Ring chunks of payloads that do not divide by N differ from the nominal (N−1)/N by a few elements per call.
    EXPECT_NEAR(got, want, 0.02 * want + 64.0 * world_size()) << coll::kind_name(kind);
  }
}

std::vector<Case> cases() {
  std::vector<Case> all;
  using O = strategy::StrategyOptions;
  for (const char* name : {"ddp", "ddp-zero", "zero0", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op",
                           "fsdp-no-shard", "fsdp-hybrid"}) {
    all.push_back({name, optim::Recipe::kMixed, "", nullptr});
  }
  for (const char* name : {"ddp", "zero0", "zero2", "fsdp", "fsdp2"}) {
    all.push_back({name, optim::Recipe::kFp32, "", nullptr});
  }
  // DeepSpeed's stage-0 all-reduce buckets (500,000,000 elements ÷ k²) at k = 1000: 500 elements, several buckets,
  // each tensor added whole, so most hold more than 500.
  all.push_back({"zero0", optim::Recipe::kMixed, "many_buckets", [](O& o) { o.shrink = 1000; }});
  all.push_back({"fsdp2", optim::Recipe::kMixed, "", nullptr});
  all.push_back({"fsdp2", optim::Recipe::kPureBf16, "pure_bf16", nullptr});
  all.push_back({"fsdp2", optim::Recipe::kMixed, "no_reshard_after_forward",
                 [](O& o) { o.fsdp2.reshard_after_forward = false; }});
  all.push_back({"ddp", optim::Recipe::kMixed, "bucket_view", [](O& o) { o.ddp.gradient_as_bucket_view = true; }});
  all.push_back({"ddp-zero", optim::Recipe::kMixed, "bucket_view", [](O& o) { o.ddp.gradient_as_bucket_view = true; }});
  all.push_back({"ddp", optim::Recipe::kMixed, "bf16_hook", [](O& o) { o.ddp.comm_hook = strategy::CommHook::kBf16; }});
  all.push_back({"zero2", optim::Recipe::kMixed, "overlap_comm", [](O& o) { o.zero.overlap_comm = true; }});
  // ZeRO-1 with overlap_comm reduces in the accumulation boundary's backward, in several buckets.
  all.push_back({"zero1", optim::Recipe::kMixed, "overlap_comm", [](O& o) {
                   o.zero.overlap_comm = true;
                   o.zero.reduce_bucket_elements = 2'000'000;
                 }});
  all.push_back({"zero2", optim::Recipe::kMixed, "small_buckets", [](O& o) { o.zero.reduce_bucket_elements = 1; }});
  all.push_back({"zero1", optim::Recipe::kMixed, "small_buckets", [](O& o) {
                   o.zero.reduce_bucket_elements = 2'000'000;
                   o.zero.allgather_bucket_elements = 3'000'000;
                 }});
  // use_multi_rank_bucket_allreduce false: each bucket's slices reduced to their owners, several buckets a step.
  all.push_back({"zero1", optim::Recipe::kMixed, "reduce_by_owner", [](O& o) {
                   o.zero.reduce_bucket_elements = 2'000'000;
                   o.zero.multi_rank_bucket_allreduce = false;
                 }});
  // contiguous_gradients false: every .grad kept to step(), each bucket of several tensors flattened; in the
  // boundary's backward with overlap_comm.
  all.push_back({"zero1", optim::Recipe::kMixed, "not_contiguous", [](O& o) {
                   o.zero.reduce_bucket_elements = 2'000'000;
                   o.zero.contiguous_gradients = false;
                 }});
  all.push_back({"zero1", optim::Recipe::kMixed, "not_contiguous_overlap_comm", [](O& o) {
                   o.zero.reduce_bucket_elements = 2'000'000;
                   o.zero.contiguous_gradients = false;
                   o.zero.overlap_comm = true;
                 }});
  all.push_back({"zero2", optim::Recipe::kMixed, "reduce_by_owner", [](O& o) {
                   o.zero.reduce_bucket_elements = 2'000'000;
                   o.zero.multi_rank_bucket_allreduce = false;
                 }});
  all.push_back({"zero3", optim::Recipe::kMixed, "persistent", [](O& o) { o.shrink = 1; }});
  all.push_back({"zero3", optim::Recipe::kMixed, "no_prefetch", [](O& o) { o.zero.prefetch_bucket_elements = 1; }});
  all.push_back({"zero3", optim::Recipe::kPureBf16, "pure_bf16", nullptr});
  all.push_back({"zero3", optim::Recipe::kMixed, "no_reuse", [](O& o) { o.zero.max_reuse_distance = 0; }});
  all.push_back({"fsdp", optim::Recipe::kMixed, "prefetch_none",
                 [](O& o) { o.fsdp.backward_prefetch = strategy::BackwardPrefetch::kNone; }});
  all.push_back({"fsdp", optim::Recipe::kMixed, "prefetch_post",
                 [](O& o) { o.fsdp.backward_prefetch = strategy::BackwardPrefetch::kPost; }});
  all.push_back({"fsdp", optim::Recipe::kMixed, "forward_prefetch", [](O& o) {
                   o.fsdp.backward_prefetch = strategy::BackwardPrefetch::kNone;
                   o.fsdp.forward_prefetch = true;
                 }});
  // torch.optim.AdamW's step temporaries (default foreach above): the for-loop and the fused kernel.
  for (const char* name : {"ddp", "fsdp", "fsdp2"}) {
    all.push_back(
        {name, optim::Recipe::kMixed, "adamw_single", [](O& o) { o.adamw_impl = optim::AdamWImpl::kSingle; }});
    all.push_back({name, optim::Recipe::kMixed, "adamw_fused", [](O& o) { o.adamw_impl = optim::AdamWImpl::kFused; }});
  }
  // A DeepSpeed config's torch_adam: ZeRO steps torch.optim.AdamW, with its temporaries, instead of FusedAdam.
  for (const char* name : {"zero1", "zero2", "zero3"}) {
    all.push_back({name, optim::Recipe::kMixed, "torch_adam", [](O& o) { o.zero.torch_adam = true; }});
  }
  // A DeepSpeed config's data_types.grad_accum_dtype "fp32" under bf16 at stage 1: BF16_Optimizer.
  all.push_back({"zero1", optim::Recipe::kMixed, "bf16_optimizer", [](O& o) { o.zero.fp32_grad_accumulation = true; }});
  all.push_back({"zero2", optim::Recipe::kMixed, "torch_adam_single", [](O& o) {
                   o.zero.torch_adam = true;
                   o.adamw_impl = optim::AdamWImpl::kSingle;
                 }});
  return all;
}

INSTANTIATE_TEST_SUITE_P(Strategies, MemoryAndTraffic, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& param) {
                           std::string name = param.param.strategy + "_" +
                                              (param.param.recipe == optim::Recipe::kFp32 ? "fp32" : "mixed") +
                                              (param.param.variant.empty() ? "" : "_" + param.param.variant);
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

// torch_adam (DeepSpeed's optimizer.params.torch_adam): torch.optim.AdamW, foreach as PyTorch defaults on a GPU, steps
// ZeRO's one flat fp32 partition and makes exp_avg_sq.sqrt(), a tensor the size of exp_avg_sq: the optimizer-state
// peak grows by exactly one of the two moments, half of what FusedAdam's run peaks at (ZeRO-3: its one sub-group,
// sub_group_size ÷ 32² being larger than the tiny model's partition). Nothing else changes. ZeRO-3's sub-group is
// DeepSpeed's, each tensor partitioned on its own (⌈t/N⌉), where emu pads each unit to N for its moments: the tiny
// Llama's tensors (the root: embed_tokens 592, norm 16, lm_head 592; a block: q, o 256, k, v 128, gate, up, down
// 704, two norms 16) hold Σ⌈t/N⌉ partition elements against the units' ⌈1200/N⌉ + 2·⌈2912/N⌉ (the same at N = 1, 2
// and 4; at N = 3 2,352 against 2,342: 4 B more for each of the 10).
class TorchAdam : public ::testing::TestWithParam<std::string> {};

uint64_t tensor_padding_beyond_units(uint64_t n) {
  const auto part = [&](uint64_t t) { return (t + n - 1) / n; };
  uint64_t tensors = part(592) + part(16) + part(592);
  for (const uint64_t t : {256, 128, 128, 256, 704, 704, 704, 16, 16}) tensors += 2 * part(t);
  return tensors - (part(1200) + 2 * part(2912));
}

TEST_P(TorchAdam, ForeachAddsOneMomentOfThePartition) {
  strategy::StrategyOptions options = test_options(GetParam(), optim::Recipe::kMixed);
  options.shrink = 32;
  const uint64_t fused =
      run_strategy(model::Style::kLlama, options, 1, 1)->device->memory().peak(Category::kOptimizerState);
  options.zero.torch_adam = true;
  auto run = run_strategy(model::Style::kLlama, options, 1, 1);
  ASSERT_GT(fused, 0U);
  const uint64_t padding = GetParam() == "zero3" ? tensor_padding_beyond_units(world_size()) : 0;
  EXPECT_EQ(run->device->memory().peak(Category::kOptimizerState), fused + fused / 2 + 4 * padding);
}

INSTANTIATE_TEST_SUITE_P(Strategies, TorchAdam, ::testing::Values("zero1", "zero2", "zero3"),
                         [](const ::testing::TestParamInfo<std::string>& param) { return param.param; });

// DeepSpeed's BF16_Optimizer (bf16_optimizer.py; zero1 with data_types.grad_accum_dtype "fp32"), by hand from the
// tiny Llama's shapes (Ψ = 1200 + 2 · 2912 = 7024, the flat bf16 group P padded to a multiple of 2N, S = P/N): the
// bf16 group 2P; the fp32 gradients of the whole group 4P, all run, beside every parameter's bf16 .grad (2Ψ) from
// backward to the step, with two micro-batches too (the second accumulates into the first's); no reduce bucket;
// master and moments over S; the fp32 gradients all-reduced once per step through a bf16 copy of them (2P, a
// temporary), where ZeRO-1 reduce-scatters: a ring all-reduce sends 2(N − 1)/N of its 2P bytes.
TEST(Bf16Optimizer, Fp32GradientsOfTheWholeGroupBesideEveryGradAndOneAllReduce) {
  strategy::StrategyOptions options = test_options("zero1", optim::Recipe::kMixed);
  options.zero.fp32_grad_accumulation = true;
  const auto n = static_cast<uint64_t>(world_size());
  const uint64_t psi = 1200 + 2 * 2912;
  const uint64_t padded = (psi + 2 * n - 1) / (2 * n) * (2 * n);
  auto run = run_strategy(model::Style::kLlama, options, /*accumulation=*/2, /*steps=*/1);
  const MemoryPool& memory = run->device->memory();
  EXPECT_EQ(memory.peak(Category::kParameters), 2 * padded);
  EXPECT_EQ(memory.peak(Category::kGradients), 4 * padded + 2 * psi);
  EXPECT_EQ(memory.peak(Category::kBuckets), 0U);
  EXPECT_EQ(memory.peak(Category::kMasterWeights), 4 * padded / n);
  EXPECT_EQ(memory.peak(Category::kOptimizerState), 8 * padded / n);
  EXPECT_GE(memory.peak(Category::kTemporaries), 2 * padded);
  uint64_t all_reduce = 0, reduce_scatter = 0, calls = 0;
  for (const auto& [key, entry] : run->world->ledger().entries()) {
    if (key.first == coll::CollectiveKind::kAllReduce && key.second.find("gradient all-reduce") != std::string::npos) {
      all_reduce += entry.moved.sent;
      calls += entry.calls;
    }
    if (key.first == coll::CollectiveKind::kReduceScatter) reduce_scatter += entry.moved.sent;
  }
  EXPECT_EQ(calls, 1U);
  EXPECT_NEAR(static_cast<double>(all_reduce), 2.0 * static_cast<double>(n - 1) / static_cast<double>(n) * 2 * padded,
              8.0 * static_cast<double>(n));
  EXPECT_EQ(reduce_scatter, 0U);
}

// The same numbers as zero1 (DeepSpeed's ZeRO optimizer), whose gradients are rounded to bf16 for the reduce-scatter
// as BF16_Optimizer's are for the all-reduce: 3 steps of two micro-batches, the loss within 1e-3 and the gradient
// norm (AdamW's update hardly moves with the gradients' scale; the norm does) within 1%.
TEST(Bf16Optimizer, TrainsAsZero1) {
  strategy::StrategyOptions options = test_options("zero1", optim::Recipe::kMixed);
  const auto zero1 = run_strategy(model::Style::kLlama, options, 2, 3);
  options.zero.fp32_grad_accumulation = true;
  const auto bf16 = run_strategy(model::Style::kLlama, options, 2, 3);
  ASSERT_EQ(bf16->trace.losses.size(), 3U);
  for (size_t step = 0; step < 3; ++step) {
    EXPECT_NEAR(bf16->trace.losses[step], zero1->trace.losses[step], 1e-3 * std::abs(zero1->trace.losses[step]))
        << "step " << step + 1;
    EXPECT_NEAR(bf16->trace.grad_norms[step], zero1->trace.grad_norms[step], 1e-2 * zero1->trace.grad_norms[step])
        << "step " << step + 1;
  }
}

// The tiny Llama's zero3 run (shrink 1, no persistence) with `prefetch` and `reuse` as DeepSpeed's knobs: its
// parameters' peak, measured and predicted, against the partitions and `at_peak` elements gathered (none on one rank),
// bf16.
void expect_gathered_peak(uint64_t prefetch, uint64_t reuse, uint64_t at_peak, bool checkpoint = false) {
  const uint64_t n = static_cast<uint64_t>(world_size());
  const auto padded = [&](uint64_t count) { return (count + n - 1) / n * n; };
  const uint64_t partitions = (padded(1200) + 2 * padded(2912)) / n;
  strategy::StrategyOptions options = test_options("zero3", optim::Recipe::kMixed);
  options.shrink = 1;
  options.zero.param_persistence_threshold = 0;
  options.zero.prefetch_bucket_elements = prefetch;
  options.zero.max_reuse_distance = reuse;
  auto run = run_strategy(model::Style::kLlama, options, 1, 1, {}, false, 2, checkpoint);
  const uint64_t gathered = n > 1 ? at_peak : 0;
  EXPECT_EQ(run->device->memory().peak(Category::kParameters), 2 * (partitions + gathered)) << "reuse " << reuse;
  const strategy::Prediction predicted = strategy::predict(options, analytic_input(*run->model, 1));
  EXPECT_EQ(predicted.peak[Category::kParameters], 2 * (partitions + gathered)) << "reuse " << reuse;
}

// ZeRO-3's gathered parameters as DeepSpeed's coordinator fetches and releases them, tensor by tensor, by hand from
// the tiny Llama's shapes (h 16, F 44, V 37, 2 heads of 8, 1 KV head, 2 layers, untied): a block's tensors in the
// order its forward uses them are input_layernorm 16, q 256, k 128, v 128, o 256, post_attention_layernorm 16, gate,
// up, down 704 each (2912); the root the embedding 592, the final norm 16 and the head 592. No persistence, no
// prefetch: a tensor stays gathered after its use when the elements the trace uses before its next use are fewer
// than stage3_max_reuse_distance. Forward to backward those are: the head 0 (its backward comes next), the final
// norm 2·592 = 1184, block 2's down_proj 1184 + 2·16 = 1216, up_proj 1216 + 2·704 = 2624, ... block 2's
// input_layernorm 7008; block 1's down_proj 2·2912 + 1216 = 7040, ... its input_layernorm 11456; the embedding
// 4·2912 + 1216 = 12864. The most gathered at once is at the head's forward (all that is kept, and the head), or
// one gate/up/down (704) when little is kept.
TEST(Zero3Reuse, TensorsWithinTheReuseDistanceStayGatheredAndTheEmbeddingIsReleasedAfterForward) {
  expect_gathered_peak(0, 12865, 2 * 2912 + 1200);  // everything kept, the embedding too
  expect_gathered_peak(0, 12864, 2 * 2912 + 608);   // the embedding released after its forward
  expect_gathered_peak(0, 7041, 2912 + 704 + 608);  // block 2, block 1's down_proj, the final norm and head
  expect_gathered_peak(0, 7040, 2912 + 608);        // block 2 whole
  expect_gathered_peak(0, 1217, 704 + 608);         // block 2's down_proj
  expect_gathered_peak(0, 1216, 704);               // the final norm and head (608) kept, a gate/up/down in use is more
  expect_gathered_peak(0, 0, 704);                  // nothing kept: one tensor at a time
}

// Under activation checkpointing a block's backward begins with its forward again, each tensor fetched for it. With
// no prefetch and a reuse distance of 1,409 elements, the recomputation's down_proj (used next by its own backward,
// nothing between) and up_proj (down_proj's two uses between, 1,408) stay to their backward: 704 + 704 gathered at
// once, in the block's backward; at 1,408 up_proj is released and one 704 tensor is the most (block 2's down_proj
// is not kept from its forward: the recomputation's first tensors come between).
TEST(Zero3Reuse, CheckpointedBlocksFetchTheirTensorsAgainForTheRecomputation) {
  expect_gathered_peak(0, 1409, 1408, /*checkpoint=*/true);
  expect_gathered_peak(0, 1408, 704, /*checkpoint=*/true);
}

// A prefetch bucket reaches past a tensor in use to its own later entry: DeepSpeed then keeps it to that use
// (__params_to_release skips a parameter a prefetch marked for a later step). Of the same tiny Llama, with no
// reuse distance and a bucket of 1,500 elements, the whole model stays gathered into backward: 2·2912 + 1200.
// Each prefetch of several tensors is one coalesced all-gather whose flat buffer lives until the last of them is
// fetched, the tensors' own copies made at the first fetch of any. The prefetches: at the embedding's fetch block
// 1's norm … gate (1504), at its norm block 1's up, down and block 2's norm, q (1680), at its q block 2's k, v, o,
// post-attention norm, gate, up (128 + 128 + 256 + 16 + 704 + 704 = 1936), at its k block 1's q (for backward),
// block 2's down, the final norm and the head, at its v block 1's norm and the embedding (for backward). From block
// 2's k to its up the whole model is gathered (as copies, or as the flat buffers of the two prefetches not yet
// waited on, of the same size) beside that third flat buffer: 2·2912 + 1200 + 1936.
TEST(Zero3Reuse, APrefetchThatReachesALaterUseKeepsTheTensor) {
  expect_gathered_peak(1500, 0, 2 * 2912 + 1200 + (128 + 128 + 256 + 16 + 704 + 704));
}

// ZeRO-3's gradients on the device as DeepSpeed makes them: autograd makes one parameter's .grad, stage3.py copies it
// into the ipg bucket (charged under buckets) and drops it, so with the optimizer offloaded (the gradient partitions
// in host memory, no step() copies on the device) the device's gradient peak is the largest tensor's .grad: the
// tiny Llama's gate or up projection, F·h = 44·16 = 704 elements, in bf16 = 1408 bytes. Whole units' gradients
// would be at least a block's 2912 elements.
TEST(Zero3Gradients, OneParametersGradAtATimeOnTheDevice) {
  strategy::StrategyOptions options = test_options("zero3", optim::Recipe::kMixed);
  options.shrink = 1;
  auto host = make_cpu_device({});
  MemoryPool::Options memory;
  memory.rank = world_rank();
  auto device = make_cpu_device(memory);
  auto world = coll::make_mpi_communicator(MPI_COMM_WORLD, *device);
  model::Model model(*device, tiny_config(model::Style::kLlama, 1), {});
  auto strategy = strategy::make_strategy({*device, *world, model, nullptr, nullptr, host.get()}, options);
  strategy->setup();
  const auto data = tiny_data(model.config());
  strategy->step(std::vector<data::Batch>{data.batch(0, data::sample_offset(world_rank(), world_size(), 0, 1), 1)});
  EXPECT_EQ(device->memory().peak(Category::kGradients), 704U * 2);
  strategy::AnalyticInput input = analytic_input(model, 1);
  input.offload = true;
  EXPECT_EQ(strategy::predict(options, input).peak[Category::kGradients], 704U * 2);
}

// Optimizer offload (--offload): the master weights and Adam moments leave the device, and so do the gradient
// partitions of the sharded strategies, as DeepSpeed's cpu_offload (ZeRO-1/2: the fp32 grad of its fp32 partition;
// ZeRO-3: its grad partitions) and FSDP1's CPUOffload (_cpu_grad) keep them in host memory. The predictor follows:
// device and host peaks by category, and the PCIe bytes.
class Offload : public ::testing::TestWithParam<std::string> {};

TEST_P(Offload, OptimizerStateAndGradientPartitionsLeaveTheDevice) {
  strategy::StrategyOptions options = test_options(GetParam(), optim::Recipe::kMixed);
  options.shrink = 32;
  auto host = make_cpu_device({});
  const int rank = world_rank();
  MemoryPool::Options memory;
  memory.rank = rank;
  auto device = make_cpu_device(memory);
  auto world = coll::make_mpi_communicator(MPI_COMM_WORLD, *device);
  model::Model model(*device, tiny_config(model::Style::kLlama, 1), {});
  const int per_node = test_ranks_per_node();
  auto intra = world->split(rank / per_node, rank, "intra-node");
  auto inter = world->split(rank % per_node, rank, "inter-node");
  auto strategy = strategy::make_strategy({*device, *world, model, intra.get(), inter.get(), host.get()}, options);
  strategy->setup();
  const auto data = tiny_data(model.config());
  const std::vector<data::Batch> batches = {data.batch(0, data::sample_offset(rank, world_size(), 0, 1), 1)};
  strategy->step(batches);
  EXPECT_EQ(device->memory().peak(Category::kMasterWeights), 0u);
  EXPECT_EQ(device->memory().peak(Category::kOptimizerState), 0u);

  strategy::AnalyticInput input = analytic_input(model, 1);
  input.offload = true;
  const auto predicted = strategy::predict(options, input);
  for (Category category : kModelStateCategories) {
    EXPECT_EQ(device->memory().peak(category), predicted.peak[category]) << "device " << category_name(category);
    EXPECT_EQ(host->memory().peak(category), predicted.host_peak[category]) << "host " << category_name(category);
  }
  // The gradients this rank updates, in host memory, at what the frameworks keep there: fp32 for ZeRO-1/2 (their
  // fp32 partition's .grad) and FSDP (the fp32 sharded gradient), bf16 for ZeRO-3 (its partitions' dtype).
  const uint64_t updated = predicted.host_peak[Category::kMasterWeights] / 4;
  const uint64_t host_grad_bytes = GetParam() == "zero3" ? 2 : 4;
  EXPECT_EQ(host->memory().peak(Category::kGradients), updated * host_grad_bytes);
  // One step: the gradients down, the updated parameters up (bf16).
  EXPECT_EQ(strategy->host_traffic().device_to_host, updated * host_grad_bytes);
  EXPECT_EQ(strategy->host_traffic().host_to_device, updated * 2);
  EXPECT_EQ(strategy->host_traffic().device_to_host, predicted.pcie.device_to_host);
  EXPECT_EQ(strategy->host_traffic().host_to_device, predicted.pcie.host_to_device);
}

INSTANTIATE_TEST_SUITE_P(Strategies, Offload, ::testing::Values("zero1", "zero2", "zero3", "fsdp"),
                         [](const ::testing::TestParamInfo<std::string>& param) { return param.param; });

}  // namespace
}  // namespace emu::testing
