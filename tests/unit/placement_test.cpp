// Where MPI put the ranks (emu/topology.h, placement_of): emu's node is L consecutive ranks, so the hosts count as
// nodes only when each holds one such block. The layouts are those mpirun makes: --map-by slot fills host 0 with
// ranks 0 .. L-1 first, --map-by node deals the ranks round-robin over the hosts.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "emu/topology.h"

namespace emu {
namespace {

// placement_of(host_of_rank) is {ranks_per_host, consecutive, detail}.
void expect_placement(const std::vector<int>& host_of_rank, int ranks_per_host, bool consecutive,
                      const std::string& detail) {
  const Placement p = placement_of(host_of_rank);
  EXPECT_EQ(p.ranks_per_host, ranks_per_host);
  EXPECT_EQ(p.consecutive, consecutive);
  EXPECT_EQ(p.detail, detail);
}

TEST(Placement, ByslotHostsAreNodesOfConsecutiveRanks) {
  // 8 ranks, 2 hosts (ids: the lowest rank on each): 0 0 0 0 4 4 4 4.
  expect_placement({0, 0, 0, 0, 4, 4, 4, 4}, 4, true, "");
  // One host: one node of every rank.
  expect_placement(std::vector<int>(5, 0), 5, true, "");
  // Blocks in another order are still blocks: host h holds h·L .. h·L + L − 1 whatever the ids.
  expect_placement({7, 7, 3, 3}, 2, true, "");
}

TEST(Placement, RoundRobinHostsAreNotConsecutive) {
  // mpirun --map-by node on 2 hosts: ranks 0, 2, 4, 6 on the first, 1, 3, 5, 7 on the second. Four per host, but
  // rank r / 4 is not its host.
  expect_placement({0, 1, 0, 1, 0, 1, 0, 1}, 4, false,
                   "2 hosts: ranks 0, 2, 4, 6 on one host, ranks 1, 3, 5, 7 on another");
}

TEST(Placement, HostsOfDifferentSizesHaveNoNodeSize) {
  // 3 ranks on one host, 5 on the other: consecutive, but no L fits both.
  expect_placement({0, 0, 0, 3, 3, 3, 3, 3}, 0, false,
                   "2 hosts: ranks 0, 1, 2 on one host, ranks 3, 4, 5, 6, 7 on another");
  // Many hosts and ranks: the first two described, the ranks cut after six.
  std::vector<int> big(32);
  for (int r = 0; r < 32; ++r) big[static_cast<size_t>(r)] = r % 4;
  expect_placement(big, 8, false,
                   "4 hosts: ranks 0, 4, 8, 12, 16, 20, ... on one host, ranks 1, 5, 9, 13, 17, 21, ... on another, "
                   "...");
}

}  // namespace
}  // namespace emu
