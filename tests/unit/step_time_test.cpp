// The step-time model (app/step_time.h) against cases worked by hand: one GEMM's roofline, the FLOPs of a Llama
// block's linears, a ring all-reduce on 8 GPUs over NVLink, the overlap of a gradient bucket with backward (one
// bucket: fully exposed; two: the first hidden), FSDP's prefetched all-gathers, a pipeline's bubble, and the
// --achievable flag's errors. Every expected value is arithmetic written out in the test, from the datasheet figures
// in hardware/*.json and the fractions the test sets itself; Gemma 2's four norms per block at their bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "app/step_time.h"
#include "collectives/virtual/virtual_link.h"
#include "emu/check.h"
#include "emu/device.h"
#include "strategies/strategy.h"
#include "tests/support/paths.h"
#include "workloads/model/config.h"

namespace emu::app {
namespace {

// A100 40GB SXM: 312 TFLOP/s bf16, 1555 GB/s HBM, NVLink 300 GB/s per direction with 3.4 µs per step, 8.4 µs
// per call (hardware/a100-40gb-sxm.json); fractions set here, not the defaults.
StepTimeSetting a100() {
  StepTimeSetting s;
  s.hardware = find_hardware("a100-40gb-sxm");
  s.achievable = {.matmul = 0.8,
                  .attention = 0.5,
                  .memory = 0.8,
                  .intra_link = 0.8,
                  .inter_link = 0.9,
                  .host_link = 0.8,
                  .cpu_adam_params_per_s = 1e9,
                  .basis = "test"};
  s.gpus_per_node = 8;
  return s;
}

TEST(StepTime, OneGemmTakesItsFlopsOverTheAchievablePeak) {
  // [4096, 4096] · [4096, 4096] in bf16: 2·4096³ = 137.44 GFLOP at 0.8 · 312 = 249.6 TFLOP/s = 0.5506 ms; its
  // 3 · 4096² · 2 B = 100.7 MB at 0.8 · 1555 GB/s take 0.081 ms, so the math bounds it.
  const model::OpCost gemm{"gemm", model::OpClass::kMatmul, 2.0 * 4096 * 4096 * 4096, 3.0 * 4096 * 4096 * 2};
  EXPECT_NEAR(op_seconds(gemm, a100(), DType::kBF16), 137.438953472e9 / 249.6e12, 1e-9);
  // In fp32 the same product runs on the 19.5 TFLOP/s units: 137.44e9 / (0.8 · 19.5e12) = 8.81 ms.
  EXPECT_NEAR(op_seconds(gemm, a100(), DType::kF32), 137.438953472e9 / 15.6e12, 1e-8);
  // An element-wise op is its bytes over the bandwidth: 1 GB at 1244 GB/s = 0.804 ms.
  const model::OpCost add{"add", model::OpClass::kMemory, 0, 1e9};
  EXPECT_NEAR(op_seconds(add, a100(), DType::kBF16), 1e9 / 1244e9, 1e-9);
}

TEST(StepTime, LlamaBlockLinearsCountTwoFlopsPerMultiplyAdd) {
  // Llama 2 7B, one sequence of 4096: T = 4096, h = 4096, F = 11008, kv = a. The linears of one block forward:
  // q, k, v, o (4 h²) and gate, up, down (3 h·F) multiply-adds per token, 2 FLOPs each:
  // 2 · 4096 · (4 · 4096² + 3 · 4096 · 11008) = 1.1053e12. Backward twice that.
  model::ModelConfig c = model::preset("llama2-7b");
  c.seq = 4096;
  c.batch = 1;
  const model::ModelOptions o;
  double forward = 0, backward = 0;
  for (const model::OpCost& op : model::block_forward_ops(c, o)) {
    if (op.op_class == model::OpClass::kMatmul) forward += op.flops;
  }
  for (const model::OpCost& op : model::block_backward_ops(c, o)) {
    if (op.op_class == model::OpClass::kMatmul) backward += op.flops;
  }
  const double hand = 2.0 * 4096 * (4.0 * 4096 * 4096 + 3.0 * 4096 * 11008);
  EXPECT_DOUBLE_EQ(forward, hand);
  EXPECT_DOUBLE_EQ(backward, 2 * hand);
  // Causal flash attention: q·kᵀ and p·v over the (s + 1)/2 keys each query sees on average, 32 heads of 128:
  // 4 · 32 · 4096 · 2048.5 · 128 = 137.47 GFLOP.
  double attention = 0;
  for (const model::OpCost& op : model::block_forward_ops(c, o)) {
    if (op.op_class == model::OpClass::kAttention) attention += op.flops;
  }
  EXPECT_DOUBLE_EQ(attention, 4.0 * 32 * 4096 * 2048.5 * 128);
}

// Gemma 2 runs four RMSNorms per block: input_layernorm and pre_feedforward_layernorm on the residual stream (read at
// its dtype, fp32 under autocast; written at the compute dtype), post_attention_layernorm and
// post_feedforward_layernorm (the sandwich) on the bf16 o_proj and down_proj outputs, given back in bf16 (type_as)
// before the add. gemma-2-9b at s 4096, b 1: T = 4096, h = 3584, T·h = 14,680,064.
//   autocast (ddp's mixed recipe), forward: 2 · T·h·(4 + 2) + 2 · T·h·(2 + 2) = 20·T·h = 293,601,280 B;
//            backward (dy and x read, dx written): 2 · T·h·(2·4 + 2) + 2 · T·h·3·2 = 32·T·h = 469,762,048 B
//   bf16 (zero2): every norm T·h·(2 + 2) forward, 3·2·T·h backward: 16·T·h = 234,881,024 B and 24·T·h
double norm_bytes(const std::vector<model::OpCost>& ops, std::vector<std::string>& names) {
  double bytes = 0;
  for (const model::OpCost& op : ops) {
    if (std::string(op.name).find("layernorm") == std::string::npos) continue;
    names.emplace_back(op.name);
    bytes += op.bytes;
  }
  return bytes;
}

TEST(StepTime, Gemma2FourNormsEachAtItsOwnInputAndOutputBytes) {
  model::ModelConfig c = model::load_hf_config(std::filesystem::path(EMU_SOURCE_DIR) / "tests/data/hf/gemma-2-9b.json");
  c.seq = 4096;
  c.batch = 1;
  const double Th = 4096.0 * 3584;
  ASSERT_EQ(Th, 14'680'064.0);
  model::ModelOptions autocast;
  autocast.compute = DType::kBF16;
  autocast.autocast = true;
  std::vector<std::string> forward, backward;
  EXPECT_DOUBLE_EQ(norm_bytes(model::block_forward_ops(c, autocast), forward), 293'601'280.0);
  EXPECT_DOUBLE_EQ(norm_bytes(model::block_backward_ops(c, autocast), backward), 469'762'048.0);
  EXPECT_EQ(forward, (std::vector<std::string>{"input_layernorm", "post_attention_layernorm",
                                               "pre_feedforward_layernorm", "post_feedforward_layernorm"}));
  EXPECT_EQ(backward.size(), 4u);
  model::ModelOptions bf16;
  bf16.compute = DType::kBF16;
  forward.clear();
  backward.clear();
  EXPECT_DOUBLE_EQ(norm_bytes(model::block_forward_ops(c, bf16), forward), 16 * Th);
  EXPECT_DOUBLE_EQ(norm_bytes(model::block_backward_ops(c, bf16), backward), 24 * Th);
}

TEST(StepTime, RingAllReduceOnEightGpusOverNvlink) {
  // 1 GB all-reduced by a ring of 8: 2(N-1) = 14 steps of 3.4 µs, 2(N-1)/N · S = 1.75 GB through each GPU's link at
  // 0.8 · 300 = 240 GB/s (7.2917 ms), plus 8.4 µs for the call: 7.3477 ms. nccl-tests would report a bus
  // bandwidth of 1.75 GB / 7.3477 ms = 238 GB/s.
  const StepTimeSetting s = a100();
  const double seconds =
      collective_seconds(coll::CollectiveKind::kAllReduce, "ring", 1e9, 8, link_for(s, Reach::kInsideNode), 8.4e-6);
  EXPECT_NEAR(seconds, 14 * 3.4e-6 + 1.75e9 / 240e9 + 8.4e-6, 1e-9);
  // HSDP's replicas, one GPU per node on its own NIC: 0.9 · 25 = 22.5 GB/s with 14 µs steps: 77.97 ms.
  const double replicas =
      collective_seconds(coll::CollectiveKind::kAllReduce, "ring", 1e9, 8, link_for(s, Reach::kOneGpuPerNode), 8.4e-6);
  EXPECT_NEAR(replicas, 14 * 14e-6 + 1.75e9 / 22.5e9 + 8.4e-6, 1e-9);
  // The world of 16 GPUs on 2 nodes: each ring crosses each node boundary once, over the node's 8 NICs together
  // (8 · 22.5 = 180 GB/s, below NVLink's 240): 2(N-1)/N · S = 1.875 GB at 180 GB/s; of the 30 steps, 2 of each 16
  // cross a node (14 µs), the rest stay on NVLink (3.4 µs): 30 · (2/16 · 14 + 14/16 · 3.4) µs.
  EXPECT_EQ(reach_of("world", 16, 16, 8), Reach::kWholeNodes);
  EXPECT_EQ(reach_of("inter-node", 2, 16, 8), Reach::kOneGpuPerNode);
  EXPECT_EQ(reach_of("world", 8, 8, 8), Reach::kInsideNode);
  const double world = collective_seconds(coll::CollectiveKind::kAllReduce, "ring", 1e9, 16,
                                          link_for(s, Reach::kWholeNodes, 16), 8.4e-6);
  EXPECT_NEAR(world, 30 * (2.0 / 16 * 14e-6 + 14.0 / 16 * 3.4e-6) + 1.875e9 / 180e9 + 8.4e-6, 1e-9);
}

// DeepSpeed's reduce to each owner (use_multi_rank_bucket_allreduce false) over NCCL's ring reduce, timed in
// pieces of emu's 4 MiB slice: 1 GB is k = 239 pieces, N+k-2 = 245 steps of 3.4 µs, and S plus one piece (4,194,304 B)
// through a middle GPU's link at 240 GB/s, plus the call's 8.4 µs: 5.026 ms, below the ring all-reduce's 7.348.
TEST(StepTime, RingReduceIsTimedInPipelinedPieces) {
  const StepTimeSetting s = a100();
  const coll::LinkModel link = link_for(s, Reach::kInsideNode);
  const double seconds = collective_seconds(coll::CollectiveKind::kReduce, "ring", 1e9, 8, link, 8.4e-6);
  EXPECT_NEAR(seconds, 245 * 3.4e-6 + (1e9 + 4194304.0) / 240e9 + 8.4e-6, 1e-9);
  EXPECT_LT(seconds, collective_seconds(coll::CollectiveKind::kAllReduce, "ring", 1e9, 8, link, 8.4e-6));
}

TEST(StepTime, OneBucketIsExposedTwoBucketsHideTheFirst) {
  // Backward of 1 s in one piece, its gradients in one bucket of 0.3 s: the all-reduce can only start when backward
  // ends, so the step is 1.3 s with 0.3 s exposed.
  const std::vector<Chunk> one = {{1.0, 0, 0.3, ""}};
  EXPECT_DOUBLE_EQ(overlap(one).seconds, 1.3);
  EXPECT_DOUBLE_EQ(overlap(one).exposed(), 0.3);
  // Two halves, a 0.3 s bucket after each: the first is reduced while the second half computes (0.5-0.8 s), the
  // second after 1.0 s: 1.3 s. A 0.6 s first bucket overlaps 0.5 s and delays the second: 0.5 + 0.6 + 0.3 = 1.4 s.
  EXPECT_DOUBLE_EQ(overlap(std::vector<Chunk>{{0.5, 0, 0.3, ""}, {0.5, 0, 0.3, ""}}).seconds, 1.3);
  EXPECT_DOUBLE_EQ(overlap(std::vector<Chunk>{{0.5, 0, 0.6, ""}, {0.5, 0, 0.3, ""}}).seconds, 1.4);
  EXPECT_DOUBLE_EQ(overlap(std::vector<Chunk>{{0.5, 0, 0.1, ""}, {0.5, 0, 0, ""}}).exposed(), 0.0);
}

TEST(StepTime, PrefetchedAllGathersHideBehindThePreviousUnit) {
  // Three units of 1 s, each needing a 0.4 s all-gather first: the first is waited for (0.4 s), the next ones are
  // fetched while the unit before computes: 0.4 + 3 = 3.4 s. With 1.5 s gathers the stream of gathers sets the
  // pace: starts at 1.5, 3.0, 4.5 s, the last unit ends at 5.5 s.
  EXPECT_DOUBLE_EQ(overlap(std::vector<Chunk>{{1, 0.4, 0, ""}, {1, 0.4, 0, ""}, {1, 0.4, 0, ""}}).seconds, 3.4);
  EXPECT_DOUBLE_EQ(overlap(std::vector<Chunk>{{1, 1.5, 0, ""}, {1, 1.5, 0, ""}, {1, 1.5, 0, ""}}).seconds, 5.5);
}

// A plan-shaped report of llama2-7b on 8 GPUs whose one strategy issued `phases`.
RunReport report_with(strategy::StrategyKind kind, std::vector<PhaseTraffic> phases, int accumulation = 1) {
  RunReport r;
  r.plan = true;
  r.world = 8;
  r.options.full = model::preset("llama2-7b");
  r.options.full.seq = 4096;
  r.options.accumulation = accumulation;
  r.options.hardware = "a100-40gb-sxm";
  StrategyOutcome o;
  o.options.kind = kind;
  o.name = "test";
  o.phase_traffic = std::move(phases);
  r.outcomes.push_back(o);
  return r;
}

TEST(StepTime, DdpBucketReadyAtTheEndOfBackwardIsExposedWhole) {
  // DDP with one bucket holding every gradient, S = 1 GB: the ring sends 2(N-1)/N · S = 1.75 GB per rank. The
  // bucket is ready when backward ends; nothing hides it, so the exposed communication is the whole call:
  // 14 · 3.4 µs + 1.75 GB / 240 GB/s + 8.4 µs = 7.3502 ms.
  const double call = 14 * 3.4e-6 + 1.75e9 / 240e9 + 8.4e-6;
  PhaseTraffic bucket{
      coll::CollectiveKind::kAllReduce, "world", 8, "ring", "backward all-reduce, bucket 0", 1, 1'000'000'000};
  const RunReport one = report_with(strategy::StrategyKind::kDdp, {bucket});
  const StepTime st = predict_step_time(one, one.outcomes[0], a100());
  EXPECT_NEAR(st.communication, call, 1e-9);
  EXPECT_NEAR(st.exposed_communication, call, 1e-9);
  EXPECT_NEAR(st.seconds, st.compute + call, 1e-9);
  // The predicted trace holds that all-reduce on the communication stream, from the end of the last backward piece,
  // and then the optimizer step.
  const auto reduction = std::find_if(st.spans.begin(), st.spans.end(), [](const PredictedSpan& span) {
    return span.name == "gradient reduction after backward, embedding";
  });
  ASSERT_NE(reduction, st.spans.end());
  EXPECT_TRUE(reduction->communication);
  EXPECT_NEAR(reduction->end - reduction->start, call, 1e-9);
  EXPECT_EQ(st.spans.back().name, "optimizer step");
  EXPECT_NEAR(st.spans.back().start, reduction->end, 1e-9);
  // The same bytes in ten buckets ready through backward: all but the last hide behind the remaining blocks.
  std::vector<PhaseTraffic> ten;
  ten.reserve(10);
  for (int i = 0; i < 10; ++i) {
    ten.push_back({coll::CollectiveKind::kAllReduce, "world", 8, "ring",
                   fmt::format("backward all-reduce, bucket {}", i), 1, 100'000'000});
  }
  const RunReport many = report_with(strategy::StrategyKind::kDdp, ten);
  const StepTime split = predict_step_time(many, many.outcomes[0], a100());
  EXPECT_LT(split.exposed_communication, 0.15 * split.communication);
  // A phase issued after backward (ZeRO-1's reduce-scatter) is exposed whatever its size.
  PhaseTraffic after{coll::CollectiveKind::kReduceScatter,
                     "world",
                     8,
                     "ring",
                     "gradient reduce-scatter, units from flat element 0",
                     1,
                     1'000'000'000};
  const RunReport zero1 = report_with(strategy::StrategyKind::kZero1, {after});
  const StepTime z = predict_step_time(zero1, zero1.outcomes[0], a100());
  // S = 1 GB: the ring's 7 steps send (N-1)/N · S = 0.875 GB at 240 GB/s.
  EXPECT_NEAR(z.exposed_communication, 7 * 3.4e-6 + 0.875e9 / 240e9 + 8.4e-6, 1e-9);
}

TEST(StepTime, EachCallIsTimedAtItsOwnPayloadWhateverItsAlgorithmSent) {
  // One all-reduce of S = 1 GB (250M fp32) over 8 GPUs with the tree (binomial reduce into rank 0, then binomial
  // broadcast): rank 0, whose ledger the step reads, sends the whole buffer in each of the broadcast's 3 rounds,
  // 3 GB, where the ring would have sent 2(N-1)/N · S = 1.75 GB. The step times the call at its payload, by the
  // tree's cost: 2·log2 8 = 6 rounds of 3.4 µs and of 1 GB at 240 GB/s, + 8.4 µs = 25.0288 ms (reductions are not
  // charged: γ = 0). Read back from the sent bytes with the ring's factor, S would be 1.714 GB and the call 42.9 ms.
  const auto device = make_shapes_device({});
  const auto world = coll::make_virtual_communicator(*device, 0, 8, "world");
  world->set_algorithm(coll::CollectiveKind::kAllReduce, "tree");
  world->all_reduce(nullptr, nullptr, 250'000'000, DType::kF32, coll::ReduceOp::kSum, "backward all-reduce, bucket 0");
  ASSERT_EQ(world->ledger().total().moved.sent, 3'000'000'000u);
  StrategyOutcome outcome;
  record_phase_traffic(outcome, *world, 1);
  ASSERT_EQ(outcome.phase_traffic.size(), 1u);
  EXPECT_EQ(outcome.phase_traffic[0].payload, 1'000'000'000u);
  const RunReport r = report_with(strategy::StrategyKind::kDdp, outcome.phase_traffic);
  const StepTime st = predict_step_time(r, r.outcomes[0], a100());
  EXPECT_NEAR(st.exposed_communication, 6 * 3.4e-6 + 6 * 1e9 / 240e9 + 8.4e-6, 1e-9);
}

TEST(StepTime, HierarchicalAllReduceOverTwoNodesOfFourUsesBothLinks) {
  // 8 A100s as 2 nodes of 4 (L = 4, M = 2), one DDP bucket of S = 1 GB: each rank sends 2(N-1)/N · S = 1.75 GB
  // with either algorithm. Links (a100() above): NVLink 3.4 µs, 0.8 · 300 = 240 GB/s; one NIC 14 µs,
  // 0.9 · 25 = 22.5 GB/s; the flat ring over whole nodes spreads over the node's 4 NICs, 4 · 22.5 = 90 GB/s (below
  // NVLink), 2 of its 8 steps per lap crossing a node: α = (2/8 · 14 + 6/8 · 3.4) µs = 6.05 µs.
  //   ring: 14 · 6.05 µs + 1.75 GB / 90 GB/s + 8.4 µs                                   = 19.5372 ms
  //   hier: 2(L-1) = 6 · 3.4 µs + 2(L-1)/L S = 1.5 GB / 240 GB/s          (within the node)
  //       + 2(M-1) = 2 · 14 µs + 2(M-1)/M · S/L = 0.25 GB / 22.5 GB/s     (between nodes, one NIC per rank)
  //       + 8.4 µs                                                                         = 17.4179 ms
  StepTimeSetting s = a100();
  s.gpus_per_node = 4;
  const double ring = 14 * (2.0 / 8 * 14e-6 + 6.0 / 8 * 3.4e-6) + 1.75e9 / 90e9 + 8.4e-6;
  const double hier = 6 * 3.4e-6 + 1.5e9 / 240e9 + 2 * 14e-6 + 0.25e9 / 22.5e9 + 8.4e-6;
  const coll::Fabric fabric = fabric_for(s, Reach::kWholeNodes, 8);
  EXPECT_NEAR(collective_seconds(coll::CollectiveKind::kAllReduce, "ring", 1e9, 8, fabric, 8.4e-6), ring, 1e-9);
  EXPECT_NEAR(collective_seconds(coll::CollectiveKind::kAllReduce, "hier", 1e9, 8, fabric, 8.4e-6), hier, 1e-9);
  // The step: the one bucket is ready when backward ends and nothing hides it, so the exposed communication is the
  // call, and the two steps differ by ring - hier = 2.119 ms.
  const auto step = [&](const char* algorithm, int gpus_per_node) {
    RunReport r = report_with(strategy::StrategyKind::kDdp, {{coll::CollectiveKind::kAllReduce, "world", 8, algorithm,
                                                              "backward all-reduce, bucket 0", 1, 1'000'000'000}});
    StepTimeSetting setting = a100();
    setting.gpus_per_node = gpus_per_node;
    return predict_step_time(r, r.outcomes[0], setting);
  };
  const StepTime ring_step = step("ring", 4), hier_step = step("hier", 4);
  EXPECT_NEAR(ring_step.exposed_communication, ring, 1e-9);
  EXPECT_NEAR(hier_step.exposed_communication, hier, 1e-9);
  EXPECT_NEAR(ring_step.seconds - hier_step.seconds, ring - hier, 1e-9);
  // On one node of 8 the hierarchical all-reduce is the ring (L = N): 14 · 3.4 µs + 1.75 GB / 240 GB/s + 8.4 µs.
  const double one_node = 14 * 3.4e-6 + 1.75e9 / 240e9 + 8.4e-6;
  EXPECT_NEAR(step("hier", 8).exposed_communication, one_node, 1e-9);
  EXPECT_NEAR(step("ring", 8).exposed_communication, one_node, 1e-9);
}

TEST(StepTime, MfuAndTokensFollowTheStep) {
  const RunReport r = report_with(strategy::StrategyKind::kZero3, {});
  const StepTime st = predict_step_time(r, r.outcomes[0], a100());
  // One micro-batch of 4096 tokens per GPU; MFU is the model's FLOPs (6 per parameter per token + attention) over
  // the step at 312 TFLOP/s.
  EXPECT_NEAR(st.tokens_per_second_per_gpu, 4096 / st.seconds, 1e-6);
  EXPECT_NEAR(st.mfu, st.model_flops / (st.seconds * 312e12), 1e-12);
  // With every op at its roofline and nothing exposed, MFU sits below the GEMM fraction but near it.
  EXPECT_GT(st.mfu, 0.5);
  EXPECT_LT(st.mfu, 0.8);
}

TEST(StepTime, PipelineBubbleIsPMinusOneSlots) {
  // pp over 8 stages and M micro-batches: (M + P − 1) slots, P − 1 of them idle.
  RunReport r = report_with(strategy::StrategyKind::kPipeline, {});
  r.options.micro_batches = 24;
  const StepTime st = predict_step_time(r, r.outcomes[0], a100());
  EXPECT_NEAR(st.bubble / st.seconds, 7.0 / 31.0, 0.01);
  // The split adds up to the step.
  EXPECT_NEAR(st.compute + st.exposed_communication + st.bubble + st.offload, st.seconds, 1e-9);
}

TEST(StepTime, TensorParallelGpusEachRunTheirSliceOfTheLinears) {
  // tp over the 8 GPUs (one TP group, Megatron's --tensor-model-parallel-size 8): each GPU multiplies by 1/8 of
  // every matrix (q, k, v, gate, up by rows, o and down by columns, the head by vocabulary rows), all eight on the same
  // micro-batch; norms and residual adds run whole on every GPU. Per GPU: 1/8 of the model's FLOPs and of the
  // micro-batch's 4096 tokens; its compute below a quarter of one GPU running the whole model (the linears, 1/8,
  // are the bulk) and above an eighth (the norms are not split).
  const RunReport whole = report_with(strategy::StrategyKind::kDdp, {});
  const RunReport tp = report_with(strategy::StrategyKind::kTensor, {});
  const StepTime one = predict_step_time(whole, whole.outcomes[0], a100());
  const StepTime eighth = predict_step_time(tp, tp.outcomes[0], a100());
  EXPECT_NEAR(eighth.model_flops, one.model_flops / 8, 1e-6 * one.model_flops);
  EXPECT_NEAR(eighth.tokens_per_second_per_gpu, 4096.0 / 8 / eighth.seconds, 1e-6);
  EXPECT_LT(eighth.compute, one.compute / 4);
  EXPECT_GT(eighth.compute, one.compute / 8);
}

TEST(StepTime, AchievableFlagIsCheckedByKeyAndRange) {
  const Achievable base = achievable_for(find_hardware("h100-80gb-sxm"));
  const Achievable set = parse_achievable("matmul=0.5,cpu_adam=2e9", base);
  EXPECT_EQ(set.matmul, 0.5);
  EXPECT_EQ(set.cpu_adam_params_per_s, 2e9);
  EXPECT_EQ(set.attention, base.attention);
  EXPECT_THROW(parse_achievable("matmul=1.5", base), InputError);
  EXPECT_THROW(parse_achievable("flops=0.5", base), InputError);
  EXPECT_THROW(parse_achievable("memory=", base), InputError);
  try {
    parse_achievable("gemm=0.5", base);
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("accepted: matmul, attention"), std::string::npos) << e.what();
  }
}

// The node the step time is predicted over: --gpus-per-node, else a node size the user declared for the run
// (--ranks-per-node, else EMU_COLL_RANKS_PER_NODE), else the hardware's (8 for an H100 SXM node).
TEST(StepTime, NodeSizeIsTheFlagThenTheDeclaredRanksPerNodeThenTheHardwares) {
  RunOptions options;
  options.hardware = "h100-80gb-sxm";
  unsetenv("EMU_COLL_RANKS_PER_NODE");
  EXPECT_EQ(step_time_setting(options).gpus_per_node, 8);
  setenv("EMU_COLL_RANKS_PER_NODE", "4", 1);
  EXPECT_EQ(step_time_setting(options).gpus_per_node, 4);
  options.ranks_per_node = 2;
  EXPECT_EQ(step_time_setting(options).gpus_per_node, 2);
  options.gpus_per_node = 16;
  EXPECT_EQ(step_time_setting(options).gpus_per_node, 16);
  unsetenv("EMU_COLL_RANKS_PER_NODE");
}

}  // namespace
}  // namespace emu::app
