// Agreement on errors: every rank reaches the same verdict, carrying the lowest failing rank's message.
#include <gtest/gtest.h>
#include <mpi.h>

#include "emu/mpi_env.h"

namespace emu {
namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

TEST(AgreeOnError, NoErrorAnywhere) { EXPECT_FALSE(agree_on_error("").has_value()); }

TEST(AgreeOnError, EveryRankGetsTheLowestFailingRanksMessage) {
  const int rank = world_rank();
  const int world = world_size();
  // The upper half of the ranks fail, each with its own message.
  const int first_failing = world / 2;
  const std::string mine = rank >= first_failing ? "bad value on rank " + std::to_string(rank) : "";
  const auto agreed = agree_on_error(mine);
  ASSERT_TRUE(agreed.has_value());
  EXPECT_EQ(agreed->message, "bad value on rank " + std::to_string(first_failing));
  EXPECT_EQ(agreed->first_rank, first_failing);
  EXPECT_EQ(agreed->ranks_with_error, world - first_failing);
}

}  // namespace
}  // namespace emu
