// Every ledger measured, not declared: for each algorithm of ours, the bytes the ledger records equal the bytes
// the MPI profiling layer saw this rank hand to MPI's point-to-point calls (tests/support/pmpi_counter.h), on
// shapes that cut into several slices, leave remainders and reach every rank count the test runs at.
//
// The "mpi" pass-through is not in the loop: Open MPI's collectives move their bytes below the profiling layer
// (its PML), so nothing here can measure them; its ledger stays the nominal volume it declares
// (algorithms/mpi_native.cpp). The test prints what the profiling layer saw of it, to show that.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "coll_world.h"
#include "collectives/verify.h"
#include "tests/support/pmpi_counter.h"

namespace emu::coll {
namespace {

using emu::testing::pmpi_bytes;
using emu::testing::pmpi_reset;
using testing::World;

struct Measured {
  Traffic ledger;
  emu::testing::PmpiBytes pmpi;
};

Measured run_once(World& world, const Algorithm& algorithm, size_t count, DType dtype, int root) {
  Communicator& comm = *world.comm;
  VerifiedCase c(*world.device, algorithm.kind, dtype, ReduceOp::kSum, count, {}, root, false, comm.rank(),
                 comm.size());
  comm.set_algorithm(algorithm.kind, algorithm.name);
  comm.ledger().reset();
  pmpi_reset();
  comm.run(c.call());
  return {comm.ledger().total(algorithm.kind).moved, pmpi_bytes()};
}

TEST(LedgerAtTheProfilingLayer, EveryAlgorithmsLedgerIsWhatMpiWasHanded) {
  CommunicatorOptions options = CommunicatorOptions::from_environment();  // the watchdog, as World
  options.slice_bytes = 96;  // 24 fp32 or 48 bf16 elements: most calls below take several slices
  World world(options);
  const int size = world.comm->size();
  for (const Algorithm* algorithm : algorithms()) {
    if (algorithm->name == "mpi") continue;
    for (const size_t count : {size_t{1}, size_t{37}, size_t{1031}}) {
      for (const DType dtype : {DType::kF32, DType::kBF16}) {
        const int root = size - 1;
        SCOPED_TRACE(
            fmt::format("{} {} count {} {}", kind_name(algorithm->kind), algorithm->name, count, dtype_name(dtype)));
        const Measured m = run_once(world, *algorithm, count, dtype, root);
        EXPECT_EQ(m.ledger.sent, m.pmpi.sent);
        EXPECT_EQ(m.ledger.received, m.pmpi.received);
      }
    }
  }
}

TEST(LedgerAtTheProfilingLayer, SendAndRecvAreWhatMpiWasHanded) {
  World world;
  Communicator& comm = *world.comm;
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<float> message(45, 1.0f);
  pmpi_reset();
  if (comm.rank() == 0) comm.send(message.data(), message.size(), DType::kF32, 1, "p2p");
  if (comm.rank() == 1) comm.recv(message.data(), message.size(), DType::kF32, 0, "p2p");
  const Traffic ledger = comm.ledger().total().moved;
  EXPECT_EQ(ledger.sent, pmpi_bytes().sent);
  EXPECT_EQ(ledger.received, pmpi_bytes().received);
}

TEST(LedgerAtTheProfilingLayer, MpiPassThroughIsInvisibleHere) {
  World world;
  const Algorithm* native = find_algorithm(CollectiveKind::kAllReduce, "mpi");
  ASSERT_NE(native, nullptr);
  const Measured m = run_once(world, *native, 1031, DType::kF32, 0);
  if (world.comm->rank() == 0) {
    std::printf(
        "mpi all_reduce of 1031 fp32 over %d rank(s): ledger (nominal) %llu B sent, profiling layer saw %llu B\n",
        world.comm->size(), static_cast<unsigned long long>(m.ledger.sent),
        static_cast<unsigned long long>(m.pmpi.sent));
  }
}

}  // namespace
}  // namespace emu::coll
