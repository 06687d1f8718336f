// The traffic ledger against nccl-tests' bus-bandwidth factors: per rank, ring all-reduce sends and receives
// 2(N-1)/N of the buffer, ring reduce-scatter and all-gather (N-1)/N, tree broadcast and reduce the buffer once per
// non-root rank; per phase label; per group after a split; send / recv; and the shapes-only path that accounts
// without moving data.
#include <gtest/gtest.h>

#include <vector>

#include "coll_world.h"
#include "emu/bf16.h"
#include "emu/check.h"

namespace emu::coll {
namespace {

using testing::World;

// nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md), written out here as literals rather than taken from
// emu's own factor functions: busBw = algBw × 2(n-1)/n for all-reduce, × (n-1)/n for reduce-scatter and
// all-gather, × 1 for broadcast and reduce. For a buffer of S bytes (the all-reduce's whole buffer, the
// reduce-scatter's input, the all-gather's output, the broadcast's or reduce's buffer) each rank of a ring sends
// and receives that factor times S; in a rooted tree every rank but the root receives (broadcast) or sends
// (reduce) S exactly once.
TEST(Ledger, RingVolumesAreNcclTestsBusBandwidthFactors) {
  World world;
  Communicator& comm = *world.comm;
  const uint64_t n = static_cast<uint64_t>(comm.size());
  const size_t count = 60 * n;  // N divides it
  const uint64_t s = count * sizeof(float);
  std::vector<float> a(count, 1.0f);
  std::vector<float> b(count, 0.0f);
  comm.all_reduce(a.data(), b.data(), count, DType::kF32, ReduceOp::kSum, "grads");
  comm.reduce_scatter(a.data(), b.data(), count / n, DType::kF32, ReduceOp::kSum, "grads");
  comm.all_gather(a.data(), b.data(), count / n, DType::kF32, "params");
  const LedgerEntry all_reduce = comm.ledger().at(CollectiveKind::kAllReduce, "grads");
  EXPECT_EQ(all_reduce.calls, 1u);
  EXPECT_EQ(all_reduce.moved.sent, 2 * (n - 1) * s / n);
  EXPECT_EQ(all_reduce.moved.received, 2 * (n - 1) * s / n);
  const LedgerEntry reduce_scatter = comm.ledger().at(CollectiveKind::kReduceScatter, "grads");
  EXPECT_EQ(reduce_scatter.moved.sent, (n - 1) * s / n);
  EXPECT_EQ(reduce_scatter.moved.received, (n - 1) * s / n);
  const LedgerEntry all_gather = comm.ledger().at(CollectiveKind::kAllGather, "params");
  EXPECT_EQ(all_gather.moved.sent, (n - 1) * s / n);
  EXPECT_EQ(all_gather.moved.received, (n - 1) * s / n);
  EXPECT_EQ(comm.ledger().total().moved, comm.ledger().total().expected);
  EXPECT_GT(comm.ledger().total().seconds, 0.0);
}

TEST(Ledger, TreeVolumesAreNcclTestsBusBandwidthFactors) {
  World world;
  Communicator& comm = *world.comm;
  const uint64_t n = static_cast<uint64_t>(comm.size());
  const int root = comm.size() - 1;
  const bool at_root = comm.rank() == root;
  const size_t count = 77;
  const uint64_t s = count * sizeof(float);
  std::vector<float> a(count, 1.0f);
  std::vector<float> b(count, 0.0f);
  comm.broadcast(a.data(), b.data(), count, DType::kF32, root, "params");
  comm.reduce(a.data(), b.data(), count, DType::kF32, ReduceOp::kSum, root, "grads");
  const LedgerEntry broadcast = comm.ledger().at(CollectiveKind::kBroadcast, "params");
  const LedgerEntry reduce = comm.ledger().at(CollectiveKind::kReduce, "grads");
  EXPECT_EQ(broadcast.moved.received, at_root ? 0 : s);
  EXPECT_EQ(reduce.moved.sent, at_root ? 0 : s);
  // What one side of the tree counts the other side counts too: over the group, (N-1)·S each way.
  uint64_t totals[2] = {broadcast.moved.sent, reduce.moved.received};
  MPI_Allreduce(MPI_IN_PLACE, totals, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(totals[0], (n - 1) * s);
  EXPECT_EQ(totals[1], (n - 1) * s);
}

TEST(Ledger, RhdMovesTheRingVolumeOnPowersOfTwo) {
  World world;
  Communicator& comm = *world.comm;
  const uint64_t n = static_cast<uint64_t>(comm.size());
  if ((n & (n - 1)) != 0) GTEST_SKIP() << "halving-doubling folds extra ranks when N is not a power of two";
  comm.set_algorithm(CollectiveKind::kAllReduce, "rhd");
  const size_t count = 64 * n;
  std::vector<float> a(count, 1.0f);
  comm.all_reduce(a.data(), a.data(), count, DType::kF32, ReduceOp::kSum);
  const uint64_t s = count * sizeof(float);
  EXPECT_EQ(comm.ledger().total(CollectiveKind::kAllReduce).moved.sent, 2 * (n - 1) * s / n);
  EXPECT_EQ(comm.ledger().total(CollectiveKind::kAllReduce).moved.received, 2 * (n - 1) * s / n);
}

TEST(Ledger, PhasesAreSeparateAndResetClears) {
  World world;
  Communicator& comm = *world.comm;
  std::vector<uint16_t> data(100, float_to_bf16(1.0f));
  for (int unit = 0; unit < 3; ++unit) {
    comm.all_reduce(data.data(), data.data(), data.size(), DType::kBF16, ReduceOp::kAvg,
                    fmt::format("backward, unit {}", unit));
  }
  comm.all_reduce(data.data(), data.data(), data.size(), DType::kBF16, ReduceOp::kAvg, "backward, unit 0");
  EXPECT_EQ(comm.ledger().at(CollectiveKind::kAllReduce, "backward, unit 0").calls, 2u);
  EXPECT_EQ(comm.ledger().at(CollectiveKind::kAllReduce, "backward, unit 2").calls, 1u);
  EXPECT_EQ(comm.ledger().total(CollectiveKind::kAllReduce).calls, 4u);
  EXPECT_EQ(comm.ledger().entries().size(), 3u);
  EXPECT_EQ(comm.sequence(), 4u);
  comm.ledger().reset();
  EXPECT_EQ(comm.ledger().total().calls, 0u);
}

// Hybrid sharding's groups: "nodes" of two ranks (intra-node) and one group per local index (inter-node).
TEST(Ledger, SplitGroupsKeepTheirOwnLedgers) {
  World world;
  Communicator& comm = *world.comm;
  const int rank = comm.rank();
  auto intra = comm.split(rank / 2, rank, fmt::format("intra-node {}", rank / 2));
  auto inter = comm.split(rank % 2, rank, fmt::format("inter-node {}", rank % 2));
  const int node_size = std::min(2, comm.size() - rank / 2 * 2);
  EXPECT_EQ(intra->size(), node_size);
  EXPECT_EQ(intra->rank(), rank % 2);
  EXPECT_EQ(inter->rank(), rank / 2);
  std::vector<float> data(10, 1.0f);
  intra->all_reduce(data.data(), data.data(), data.size(), DType::kF32, ReduceOp::kSum, "intra");
  for (float v : data) EXPECT_EQ(v, static_cast<float>(node_size));
  inter->all_reduce(data.data(), data.data(), data.size(), DType::kF32, ReduceOp::kSum, "inter");
  EXPECT_EQ(comm.ledger().total().calls, 0u);
  EXPECT_EQ(intra->ledger().at(CollectiveKind::kAllReduce, "intra").calls, 1u);
  EXPECT_EQ(inter->ledger().at(CollectiveKind::kAllReduce, "inter").calls, 1u);
  EXPECT_EQ(intra->ledger().group(), fmt::format("intra-node {}", rank / 2));
}

TEST(Ledger, SendAndRecvAreCountedOnTheirOwnSide) {
  World world;
  Communicator& comm = *world.comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<float> message(33, static_cast<float>(comm.rank()));
  const int rank = comm.rank();
  if (rank == 0) comm.send(message.data(), message.size(), DType::kF32, 1, "activations");
  if (rank == 1) {
    comm.recv(message.data(), message.size(), DType::kF32, 0, "activations");
    for (float v : message) EXPECT_EQ(v, 0.0f);
  }
  const uint64_t bytes = 33 * sizeof(float);
  EXPECT_EQ(comm.ledger().at(CollectiveKind::kSend, "activations").moved.sent, rank == 0 ? bytes : 0);
  EXPECT_EQ(comm.ledger().at(CollectiveKind::kRecv, "activations").moved.received, rank == 1 ? bytes : 0);
  EXPECT_EQ(comm.sequence(), 0u) << "point-to-point calls are not numbered";
}

// The hierarchical all-reduce on two nodes of L = N/2 ranks (even N of at least 4; other sizes have no two such
// nodes and check nothing here), S = 60·N floats. By hand: within a node, the ring over L ranks sends and receives
// 2(L-1)/L of S; between the two nodes each rank all-reduces its S/L shard with one peer, 2(2-1)/2 · S/L = S/L each
// way. The flat ring over the same ranks sends 2(N-1)/N of S, and all of it crosses between the nodes on rank L-1
// (whose next is rank L) and rank N-1 (whose next is rank 0): 1.75 S against hier's S/4 at N = 8.
TEST(Ledger, HierarchicalAllReduceSendsOneShareBetweenNodes) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 4 || size % 2 != 0) return;
  CommunicatorOptions options = CommunicatorOptions::from_environment();
  options.ranks_per_node = size / 2;
  World world(options);
  Communicator& comm = *world.comm;
  const uint64_t n = static_cast<uint64_t>(size);
  const uint64_t l = n / 2;
  const size_t count = 60 * n;
  const uint64_t s = count * sizeof(float);
  std::vector<float> a(count, 1.0f);
  std::vector<float> b(count, 0.0f);
  comm.set_algorithm(CollectiveKind::kAllReduce, "hier");
  comm.all_reduce(a.data(), b.data(), count, DType::kF32, ReduceOp::kSum, "hier");
  EXPECT_EQ(b, std::vector<float>(count, static_cast<float>(n)));
  const LedgerEntry hier = comm.ledger().at(CollectiveKind::kAllReduce, "hier");
  EXPECT_EQ(hier.moved.sent, 2 * (l - 1) * s / l + s / l);
  EXPECT_EQ(hier.moved.received, 2 * (l - 1) * s / l + s / l);
  EXPECT_EQ(hier.between_nodes.sent, s / l);
  EXPECT_EQ(hier.between_nodes.received, s / l);
  comm.set_algorithm(CollectiveKind::kAllReduce, "ring");
  comm.all_reduce(a.data(), b.data(), count, DType::kF32, ReduceOp::kSum, "ring");
  const LedgerEntry ring = comm.ledger().at(CollectiveKind::kAllReduce, "ring");
  const bool crosses = comm.rank() == static_cast<int>(l) - 1 || comm.rank() == size - 1;
  EXPECT_EQ(ring.between_nodes.sent, crosses ? 2 * (n - 1) * s / n : 0);
}

// A shapes-only device holds no data: nothing is sent, the ledger gets the declared volumes and the buffers are
// charged against the cap.
TEST(Ledger, ShapesDeviceAccountsWithoutMoving) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MemoryPool::Options memory;
  memory.rank = rank;
  auto device = make_shapes_device(memory);
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, *device, "world", CommunicatorOptions{});
  const size_t count = 1 << 20;
  comm->all_reduce(nullptr, nullptr, 0, DType::kF32, ReduceOp::kSum);
  Buffer grads = device->allocate(count, DType::kBF16, Category::kGradients);
  comm->all_reduce(grads.data(), grads.data(), count, DType::kBF16, ReduceOp::kSum, "grads");
  const Expectation declared =
      comm->algorithm(CollectiveKind::kAllReduce)
          .expect(Call{CollectiveKind::kAllReduce, nullptr, nullptr, count, {}, DType::kBF16, ReduceOp::kSum, 0, {}},
                  comm->rank(), comm->size(), comm->options().slice_bytes, comm->options().ranks_per_node);
  EXPECT_EQ(comm->ledger().at(CollectiveKind::kAllReduce, "grads").moved, declared.traffic);
  EXPECT_EQ(device->memory().peak(Category::kCommBuffers), declared.buffer_bytes);
}

// Communication buffers count against the cap: a cap with no room for the ring's scratch is an out-of-memory.
TEST(Ledger, CommBuffersCountAgainstTheCap) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) GTEST_SKIP() << "one rank needs no buffers";
  MemoryPool::Options memory;
  memory.rank = rank;
  memory.cap = 4096;
  auto device = make_cpu_device(memory);
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, *device, "world", CommunicatorOptions{});
  Buffer data = device->allocate(1024, DType::kF32, Category::kGradients);  // the whole cap
  EXPECT_THROW(comm->all_reduce(data.data(), data.data(), 1024, DType::kF32, ReduceOp::kSum), OutOfMemoryError);
}

}  // namespace
}  // namespace emu::coll
