// FSDP2 (fully_shard) on the tiny Llama of the ladder (hidden 16, FFN 44, vocabulary 37, one KV head of 8, two
// blocks), whose dims 0 need padding at 3, 5 and 8 ranks: the bytes a rank holds, from the tensors' shapes by hand
// (torch.chunk on dim 0, every chunk padded to ceil(rows / N) rows: _fsdp_param.py, FSDPParam._init_sharded_param),
// not from emu's shard arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "tests/mpi/fsdp2_shapes.h"
#include "tests/mpi/strategy_harness.h"

namespace emu::testing {
namespace {

// Mixed recipe: fp32 sharded parameters (no master copy), bf16 unsharded units. The root stays unsharded from its
// forward to the end of backward; reshard_after_forward=True frees a block after its forward, so at most one block
// is unsharded beside it; False keeps both blocks from forward to backward.
TEST(Fsdp2, ParametersArePaddedPerTensorOnDim0) {
  const int64_t n = world_size();
  const int64_t sharded = 4 * (shard(kRoot, n) + kBlocks * shard(kBlock, n));
  const int64_t root = 2 * n * shard(kRoot, n), block = 2 * n * shard(kBlock, n);
  {
    auto run = run_strategy(model::Style::kLlama, mixed(), /*accumulation=*/1, /*steps=*/1);
    EXPECT_EQ(run->device->memory().peak(Category::kParameters), static_cast<uint64_t>(sharded + root + block));
    EXPECT_EQ(run->device->memory().peak(Category::kMasterWeights), 0u);
    // Adam's m and v over the fp32 shards, and foreach AdamW's temporary: one more copy of them.
    EXPECT_EQ(run->device->memory().peak(Category::kOptimizerState), static_cast<uint64_t>(3 * sharded));
    // All-gathers: the root once, each block twice (forward and backward), each N·S bf16 elements.
    const coll::LedgerEntry gathers = run->world->ledger().total(coll::CollectiveKind::kAllGather);
    EXPECT_EQ(gathers.calls, n > 1 ? uint64_t{1 + 2 * kBlocks} : 0u);
    // Reduce-scatters in fp32: every unit once, N·S elements, of which a rank sends (N−1)/N.
    const coll::LedgerEntry reduces = run->world->ledger().total(coll::CollectiveKind::kReduceScatter);
    EXPECT_EQ(reduces.moved.sent, static_cast<uint64_t>((n - 1) * sharded));
  }
  strategy::StrategyOptions kept = mixed();
  kept.fsdp2.reshard_after_forward = false;
  auto run = run_strategy(model::Style::kLlama, kept, 1, 1);
  EXPECT_EQ(run->device->memory().peak(Category::kParameters), static_cast<uint64_t>(sharded + root + kBlocks * block));
  EXPECT_EQ(run->world->ledger().total(coll::CollectiveKind::kAllGather).calls, n > 1 ? uint64_t{1 + kBlocks} : 0u);
}

// The buffers between the unsharded units and the collectives (kBuckets), at their peak: in forward the root's
// all-gather output kept (for overlap) beside block 1's; in backward block 2's fp32 reduce-scatter input kept until
// block 1's reduce-scatter, beside block 1's all-gather output, prefetched; the root's fp32 input alone. At one rank
// nothing is kept for overlap, so forward holds one output at a time.
TEST(Fsdp2, AllGatherOutputsAndReduceScatterInputsAtTheirPeak) {
  const int64_t n = world_size();
  const int64_t root = n * shard(kRoot, n), block = n * shard(kBlock, n);
  const int64_t forward = n > 1 ? 2 * (root + block) : 2 * std::max(root, block);
  const int64_t backward = 4 * block + 2 * block;
  const int64_t expected = std::max({forward, backward, 4 * root});
  auto run = run_strategy(model::Style::kLlama, mixed(), 1, 1);
  EXPECT_EQ(run->device->memory().peak(Category::kBuckets), static_cast<uint64_t>(expected));
  // Gradients: the root's bf16 unsharded gradients of the head and the final norm (autograd makes them first) through
  // the whole backward beside a block's, and the fp32 shards reduced so far; the embeddings' (embed_tokens, [37, 16])
  // made last, then the whole root beside the blocks' shards; at the end every fp32 shard.
  const int64_t root_grads = 2 * real(kRoot), block_grads = 2 * real(kBlock);
  const int64_t head_grads = root_grads - 2 * 37 * 16;
  const int64_t shards = 4 * (shard(kRoot, n) + kBlocks * shard(kBlock, n));
  const int64_t during = head_grads + block_grads + 4 * shard(kBlock, n);  // block 1's backward
  EXPECT_EQ(run->device->memory().peak(Category::kGradients),
            static_cast<uint64_t>(std::max({during, shards, root_grads + 4 * kBlocks * shard(kBlock, n)})));
}

// kBuckets in use right after the `occurrence`-th (from 1) change of `category` by `delta` bytes on the timeline.
uint64_t buckets_after(const MemoryPool& memory, Category category, int64_t delta, int occurrence) {
  int64_t buckets = 0;
  for (const TimelinePoint& point : memory.timeline()) {
    if (point.category == Category::kBuckets) buckets += point.delta;
    if (point.category == category && point.delta == delta && --occurrence == 0) return static_cast<uint64_t>(buckets);
  }
  ADD_FAILURE() << "no change of " << category_name(category) << " by " << delta << " bytes";
  return 0;
}

// What FSDP2 keeps beyond its use, at the moments it matters: in forward the previous unit's all-gather output until
// the next unit's copy-out (FSDPCommContext.all_gather_state: at one rank there is no collective to overlap), in
// backward a block's fp32 reduce-scatter input until the next unit's reduce-scatter (reduce_scatter_states): block 2's
// is still there when block 1's first gradient is made (autograd makes each parameter's as backward reaches it:
// down_proj's [16, 44] in bf16 first, then up_proj's and gate_proj's of the same size).
TEST(Fsdp2, KeepsTheLastAllGatherOutputAndReduceScatterInput) {
  const int64_t n = world_size();
  const int64_t root = n * shard(kRoot, n), block = n * shard(kBlock, n);
  auto run = run_strategy(model::Style::kLlama, mixed(), 1, 1);
  const MemoryPool& memory = run->device->memory();
  EXPECT_EQ(buckets_after(memory, Category::kBuckets, 2 * block, 1),
            static_cast<uint64_t>(n > 1 ? 2 * root + 2 * block : 2 * block));
  const int64_t mlp_weight = 2 * 16 * 44;  // the fourth such gradient is block 1's down_proj's
  EXPECT_EQ(buckets_after(memory, Category::kGradients, mlp_weight, 4), static_cast<uint64_t>(4 * block));
}

// CPUOffloadPolicy: the sharded parameters, their gradients and Adam's state in host memory; each all-gather first
// copies the fp32 shard up (a transient beside the all-gather output), each reduce-scatter output goes down.
TEST(Fsdp2, OffloadKeepsShardsInHostMemory) {
  const int64_t n = world_size();
  const int64_t sharded = 4 * (shard(kRoot, n) + kBlocks * shard(kBlock, n));
  auto host = make_cpu_device({});
  MemoryPool::Options memory;
  memory.rank = world_rank();
  auto device = make_cpu_device(memory);
  auto world = coll::make_mpi_communicator(MPI_COMM_WORLD, *device);
  model::ModelOptions model_options;
  model_options.compute = DType::kBF16;
  model::Model model(*device, tiny_config(model::Style::kLlama, 1), model_options);
  auto strategy = strategy::make_strategy({*device, *world, model, nullptr, nullptr, host.get()}, mixed());
  strategy->setup();
  const auto data = tiny_data(model.config());
  const std::vector<data::Batch> batches = {data.batch(0, data::sample_offset(world_rank(), world_size(), 0, 1), 1)};
  strategy->step(batches);
  EXPECT_EQ(device->memory().peak(Category::kParameters),
            static_cast<uint64_t>(2 * n * (shard(kRoot, n) + shard(kBlock, n))));
  EXPECT_EQ(device->memory().peak(Category::kOptimizerState), 0u);
  EXPECT_EQ(host->memory().peak(Category::kParameters), static_cast<uint64_t>(sharded));
  EXPECT_EQ(host->memory().peak(Category::kGradients), static_cast<uint64_t>(sharded));
  EXPECT_EQ(host->memory().peak(Category::kOptimizerState), static_cast<uint64_t>(3 * sharded));
  EXPECT_EQ(strategy->host_traffic().device_to_host, static_cast<uint64_t>(sharded));
  EXPECT_EQ(strategy->host_traffic().host_to_device,
            static_cast<uint64_t>(4 * (shard(kRoot, n) + 2 * kBlocks * shard(kBlock, n))));
}

}  // namespace
}  // namespace emu::testing
