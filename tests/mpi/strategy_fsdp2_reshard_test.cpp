// FSDP2's reshard_after_forward=M (an int) at 4 and 8 ranks, the counts with pairs of ranks to reshard to.
#include <gtest/gtest.h>

#include <vector>

#include "tests/mpi/fsdp2_shapes.h"

namespace emu::testing {
namespace {

// reshard_after_forward=2: each block keeps half of its padded unsharded parameters (bf16) from its forward to its
// backward, where it is all-gathered within its pair of ranks; the unsharded parameters at the peak are the root's
// and one block's beside both blocks' halves (block 2's made while it is still unsharded, block 1's kept).
TEST(Fsdp2, ReshardsToASmallerGroupAfterForward) {
  const int64_t n = world_size();
  ASSERT_TRUE(n % 2 == 0 && n > 2) << "runs at 4 or more ranks in pairs, not " << n;
  const int rank = world_rank();
  MemoryPool::Options memory;
  memory.rank = rank;
  auto device = make_cpu_device(memory);
  auto world = coll::make_mpi_communicator(MPI_COMM_WORLD, *device);
  auto pairs = world->split(rank / 2, rank, "post-forward");
  model::ModelOptions model_options;
  model_options.compute = DType::kBF16;
  model::Model model(*device, tiny_config(model::Style::kLlama, 1), model_options);
  strategy::StrategyOptions options = mixed();
  options.fsdp2.post_forward_ranks = 2;
  auto strategy =
      strategy::make_strategy({*device, *world, model, nullptr, nullptr, nullptr, nullptr, pairs.get()}, options);
  strategy->setup();
  const auto data = tiny_data(model.config());
  const std::vector<data::Batch> batches = {data.batch(0, data::sample_offset(rank, world_size(), 0, 1), 1)};
  const float loss = strategy->step(batches).loss;
  const int64_t sharded = 4 * (shard(kRoot, n) + kBlocks * shard(kBlock, n));
  const int64_t root = 2 * n * shard(kRoot, n), block = 2 * n * shard(kBlock, n);
  EXPECT_EQ(device->memory().peak(Category::kParameters), static_cast<uint64_t>(sharded + root + block + block));
  EXPECT_EQ(world->ledger().total(coll::CollectiveKind::kAllGather).calls, uint64_t{1 + kBlocks});
  EXPECT_EQ(pairs->ledger().total(coll::CollectiveKind::kAllGather).calls, uint64_t{kBlocks});
  // Each backward all-gather sends this rank's half of the block: N·S_b/2 bf16 elements.
  EXPECT_EQ(pairs->ledger().total(coll::CollectiveKind::kAllGather).moved.sent,
            static_cast<uint64_t>(kBlocks * block / 2));
  // The same numbers as resharding to the whole world (which the equivalence ladder holds to single-device
  // training): the halves gathered in backward are the bf16 values the forward used.
  auto other_device = make_cpu_device(memory);
  auto other_world = coll::make_mpi_communicator(MPI_COMM_WORLD, *other_device);
  model::Model other_model(*other_device, tiny_config(model::Style::kLlama, 1), model_options);
  auto reference = strategy::make_strategy({*other_device, *other_world, other_model}, mixed());
  reference->setup();
  EXPECT_EQ(reference->step(batches).loss, loss);
  for (int u = 0; u < model.num_units(); ++u) EXPECT_EQ(strategy->full_weights(u), reference->full_weights(u)) << u;
}

}  // namespace
}  // namespace emu::testing
