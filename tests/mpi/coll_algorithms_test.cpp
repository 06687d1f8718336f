// Every algorithm of every kind, at every rank count the test runs at: sizes 0, 1, N-1, a prime (1031) and a
// multi-slice case, fp32 and bf16, sum / avg / max, in place and out of place, roots 0 and N-1. Each result is
// compared with the exact answer and, bit for bit, with MPI's own collective on the same inputs; the ledger must
// equal the algorithm's declared bytes, and the communication buffers it allocated its declared size.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "coll_world.h"
#include "collectives/verify.h"

namespace emu::coll {
namespace {

using testing::World;

struct Shape {
  size_t count;
  size_t slice_bytes;
  int64_t shrink = 1;      // k: scratch charged at slice_bytes / k² (a shrunk run), messages still in slice_bytes
  int ranks_per_node = 0;  // nodes of this many consecutive ranks (0: one node)
};

std::string describe(const Algorithm& algorithm, const Shape& shape, DType dtype, ReduceOp op, bool in_place,
                     int root) {
  return fmt::format("{} {} count {} slice {} B k {} ranks per node {} {} {} {} root {}", kind_name(algorithm.kind),
                     algorithm.name, shape.count, shape.slice_bytes, shape.shrink, shape.ranks_per_node,
                     dtype_name(dtype), op_name(op), in_place ? "in place" : "out of place", root);
}

// Output bytes of a case (all this rank holds after the call), for the comparison with MPI.
std::vector<char> output_of(const VerifiedCase& c, int rank, int size) {
  const Call& call = c.call();
  size_t count = call.count;
  if (call.kind == CollectiveKind::kAllGather || call.kind == CollectiveKind::kAllToAll)
    count *= static_cast<size_t>(size);
  if (call.kind == CollectiveKind::kReduce && rank != call.root) count = 0;
  if (call.kind == CollectiveKind::kBarrier) count = 0;
  const auto* data = static_cast<const char*>(call.recv);
  return std::vector<char>(data, data + count * dtype_size(call.dtype));
}

void run_case(World& world, const Algorithm& algorithm, const Shape& shape, DType dtype, ReduceOp op, bool in_place,
              int root) {
  Communicator& comm = *world.comm;
  const int rank = comm.rank();
  const int size = comm.size();
  SCOPED_TRACE(describe(algorithm, shape, dtype, op, in_place, root));
  VerifiedCase ours(*world.device, algorithm.kind, dtype, op, shape.count, {}, root, in_place, rank, size);
  VerifiedCase reference(*world.device, algorithm.kind, dtype, op, shape.count, {}, root, in_place, rank, size);

  comm.set_algorithm(algorithm.kind, algorithm.name);
  comm.ledger().reset();
  world.device->memory().reset_peaks();
  comm.run(ours.call());
  const uint64_t buffer_peak = world.device->memory().peak(Category::kCommBuffers);
  const LedgerEntry entry = comm.ledger().total(algorithm.kind);
  // Declared at the charged slice: slice_bytes itself at k = 1, slice_bytes / k² in a shrunk run.
  const Expectation declared = algorithm.expect(
      ours.call(), rank, size, shape.slice_bytes / (shape.shrink * shape.shrink), shape.ranks_per_node);

  comm.set_algorithm(algorithm.kind, "mpi");
  comm.run(reference.call());

  EXPECT_EQ(ours.wrong(), 0u);
  EXPECT_EQ(reference.wrong(), 0u) << "MPI's own collective";
  EXPECT_EQ(output_of(ours, rank, size), output_of(reference, rank, size)) << "differs from MPI's";
  EXPECT_EQ(entry.calls, 1u);
  EXPECT_EQ(entry.moved.sent, declared.traffic.sent);
  EXPECT_EQ(entry.moved.received, declared.traffic.received);
  EXPECT_EQ(entry.expected, declared.traffic);
  // Bytes exchanged with other nodes' ranks, where the algorithm states them (hier), are what it counted.
  if (declared.between_nodes) {
    EXPECT_EQ(entry.between_nodes, *declared.between_nodes) << "between nodes";
  }
  EXPECT_EQ(buffer_peak, declared.buffer_bytes) << "communication buffers";
  EXPECT_EQ(world.device->memory().in_use(Category::kCommBuffers), 0u) << "buffers released";
}

// node_aware: the algorithm states its bytes between nodes (hier), so it runs over nodes too.
std::vector<Shape> shapes(int size, bool node_aware) {
  const size_t n = static_cast<size_t>(size);
  std::vector<Shape> list;
  for (size_t count : std::set<size_t>{0, 1, n > 1 ? n - 1 : 0, 1031}) list.push_back({count, 4 << 20});
  list.push_back({1031, 256});  // many slices per block
  // A shrunk run (k = 4): messages in 1024-byte slices, scratch charged for 1024 / 16 = 64-byte slices.
  list.push_back({1031, 1024, 4});
  // Nodes: one rank per node, and every divisor of N between.
  for (int per_node = 1; node_aware && per_node < size; ++per_node) {
    if (size % per_node != 0) continue;
    for (size_t count : std::set<size_t>{n > 1 ? n - 1 : 0, 1031}) list.push_back({count, 4 << 20, 1, per_node});
    list.push_back({1031, 256, 1, per_node});
  }
  return list;
}

class EveryAlgorithm : public ::testing::TestWithParam<const Algorithm*> {};

TEST_P(EveryAlgorithm, MatchesTheExactAnswerAndMpi) {
  const Algorithm& algorithm = *GetParam();
  const int size = World().comm->size();
  const bool reduces = algorithm.kind == CollectiveKind::kAllReduce ||
                       algorithm.kind == CollectiveKind::kReduceScatter || algorithm.kind == CollectiveKind::kReduce;
  const bool rooted = algorithm.kind == CollectiveKind::kBroadcast || algorithm.kind == CollectiveKind::kReduce;
  const std::set<int> roots = rooted ? std::set<int>{0, size - 1} : std::set<int>{0};
  const Call probe{algorithm.kind, nullptr, nullptr, 1, {}, DType::kF32, ReduceOp::kSum, 0, {}};
  const bool node_aware = algorithm.expect(probe, 0, size, 4 << 20, 1).between_nodes.has_value();
  for (const Shape& shape : shapes(size, node_aware)) {
    CommunicatorOptions options = CommunicatorOptions::from_environment();  // the watchdog, as World
    options.slice_bytes = shape.slice_bytes;
    options.shrink = shape.shrink;
    options.ranks_per_node = shape.ranks_per_node;
    World world(options);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (bool in_place : {false, true}) {
        for (int root : roots) {
          run_case(world, algorithm, shape, dtype, ReduceOp::kSum, in_place, root);
          if (reduces && shape.count == 1031 && shape.slice_bytes > 256 && shape.shrink == 1) {
            run_case(world, algorithm, shape, dtype, ReduceOp::kAvg, in_place, root);
            run_case(world, algorithm, shape, dtype, ReduceOp::kMax, in_place, root);
          }
        }
      }
    }
  }
}

std::string algorithm_test_name(const ::testing::TestParamInfo<const Algorithm*>& info) {
  return std::string(kind_name(info.param->kind)) + "_" + std::string(info.param->name);
}

INSTANTIATE_TEST_SUITE_P(Registry, EveryAlgorithm, ::testing::ValuesIn(algorithms().begin(), algorithms().end()),
                         algorithm_test_name);

// Uneven blocks (ZeRO partitions), some of them empty, through the _v variants of both ring algorithms and MPI.
TEST(UnevenBlocks, ReduceScatterAndAllGather) {
  World world;
  Communicator& comm = *world.comm;
  const int size = comm.size();
  std::vector<size_t> counts;
  counts.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) counts.push_back(static_cast<size_t>((r * 37 + 11) % 53) * (r % 3 == 1 ? 0 : 1));
  for (CollectiveKind kind : {CollectiveKind::kReduceScatter, CollectiveKind::kAllGather}) {
    for (const Algorithm* algorithm : algorithms_for(kind)) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} {}", kind_name(kind), algorithm->name, in_place ? "in place" : ""));
        VerifiedCase c(*world.device, kind, DType::kBF16, ReduceOp::kSum, 0, counts, 0, in_place, comm.rank(), size);
        comm.set_algorithm(kind, algorithm->name);
        comm.ledger().reset();
        comm.run(c.call());
        EXPECT_EQ(c.wrong(), 0u);
        const LedgerEntry entry = comm.ledger().total(kind);
        EXPECT_EQ(entry.moved, entry.expected);
      }
    }
  }
}

TEST(UnevenBlocks, PublicVariantsTakeCounts) {
  World world;
  Communicator& comm = *world.comm;
  const int size = comm.size();
  const auto n = static_cast<size_t>(size);
  std::vector<size_t> counts(n);
  for (size_t r = 0; r < n; ++r) counts[r] = r + 1;
  const size_t total = n * (n + 1) / 2;
  std::vector<float> input(total, 1.0f);
  std::vector<float> block(counts[static_cast<size_t>(comm.rank())], 0.0f);
  comm.reduce_scatter_v(input.data(), block.data(), counts, DType::kF32, ReduceOp::kSum, "zero partitions");
  for (float value : block) EXPECT_EQ(value, static_cast<float>(size));
  std::vector<float> gathered(total, 0.0f);
  comm.all_gather_v(block.data(), gathered.data(), counts, DType::kF32, "zero partitions");
  for (float value : gathered) EXPECT_EQ(value, static_cast<float>(size));
}

// The same blocks given as a window over equal shards (ZeRO's bucket ranges): shards of 3 elements, the window
// [2, 3·N − 1), so the first and last ranks hold 1 and 2 elements, every other rank 3. The sums and the ledger's
// bytes are those of the same blocks given as counts, written out here.
TEST(UnevenBlocks, WindowOverEqualShardsMovesWhatItsCountsMove) {
  World world;
  Communicator& comm = *world.comm;
  const int size = comm.size();
  const auto n = static_cast<size_t>(size);
  if (size < 2) GTEST_SKIP() << "a window's partial ends need two ranks";
  const ShardWindow window{3, 2, 3 * n - 1};
  std::vector<size_t> counts(n, 3);
  counts.front() = 1;
  counts.back() = 2;
  const size_t total = 3 * n - 3;
  const size_t mine = counts[static_cast<size_t>(comm.rank())];
  std::vector<float> input(total);
  for (size_t i = 0; i < total; ++i) input[i] = static_cast<float>(i + 1);
  std::vector<float> by_window(mine, 0.0f), by_counts(mine, 0.0f);
  comm.ledger().reset();
  comm.reduce_scatter_v(input.data(), by_window.data(), window, DType::kF32, ReduceOp::kSum, "window");
  const LedgerEntry windowed = comm.ledger().total(CollectiveKind::kReduceScatter);
  comm.ledger().reset();
  comm.reduce_scatter_v(input.data(), by_counts.data(), counts, DType::kF32, ReduceOp::kSum, "counts");
  const LedgerEntry counted = comm.ledger().total(CollectiveKind::kReduceScatter);
  EXPECT_EQ(by_window, by_counts);
  EXPECT_EQ(windowed.moved, counted.moved);
  EXPECT_EQ(windowed.payload, counted.payload);
  std::vector<float> gathered_window(total, 0.0f), gathered_counts(total, 0.0f);
  comm.ledger().reset();
  comm.all_gather_v(by_window.data(), gathered_window.data(), window, DType::kF32, "window");
  const LedgerEntry gathered_windowed = comm.ledger().total(CollectiveKind::kAllGather);
  comm.ledger().reset();
  comm.all_gather_v(by_counts.data(), gathered_counts.data(), counts, DType::kF32, "counts");
  EXPECT_EQ(gathered_window, gathered_counts);
  EXPECT_EQ(gathered_windowed.moved, comm.ledger().total(CollectiveKind::kAllGather).moved);
  for (size_t i = 0; i < total; ++i) EXPECT_EQ(gathered_window[i], static_cast<float>(size) * (i + 1)) << i;
}

}  // namespace
}  // namespace emu::coll
