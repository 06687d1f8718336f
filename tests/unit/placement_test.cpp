// Where MPI put the ranks (emu/topology.h, placement_of): emu's node is L consecutive ranks, so the hosts count as
// nodes only when each holds one such block. The layouts are those mpirun makes: --map-by slot fills host 0 with
// ranks 0 .. L-1 first, --map-by node deals the ranks round-robin over the hosts.
#include <gtest/gtest.h>

#include <vector>

#include "emu/topology.h"

namespace emu {
namespace {

TEST(Placement, ByslotHostsAreNodesOfConsecutiveRanks) {
  // 8 ranks, 2 hosts (ids: the lowest rank on each): 0 0 0 0 4 4 4 4.
  const std::vector<int> by_slot = {0, 0, 0, 0, 4, 4, 4, 4};
  const Placement p = placement_of(by_slot);
  EXPECT_EQ(p.ranks_per_host, 4);
  EXPECT_TRUE(p.consecutive);
  EXPECT_EQ(p.detail, "");
  // One host: one node of every rank.
  EXPECT_TRUE(placement_of(std::vector<int>(5, 0)).consecutive);
  EXPECT_EQ(placement_of(std::vector<int>(5, 0)).ranks_per_host, 5);
}

TEST(Placement, RoundRobinHostsAreNotConsecutive) {
  // mpirun --map-by node on 2 hosts: ranks 0, 2, 4, 6 on the first, 1, 3, 5, 7 on the second. Four per host, but
  // rank r / 4 is not its host.
  const std::vector<int> by_node = {0, 1, 0, 1, 0, 1, 0, 1};
  const Placement p = placement_of(by_node);
  EXPECT_EQ(p.ranks_per_host, 4);
  EXPECT_FALSE(p.consecutive);
  EXPECT_EQ(p.detail, "2 hosts: ranks 0, 2, 4, 6 on one host, ranks 1, 3, 5, 7 on another");
  // Blocks in the wrong order are still blocks: host h holds h·L .. h·L + L − 1 whatever the ids.
  EXPECT_TRUE(placement_of(std::vector<int>{7, 7, 3, 3}).consecutive);
}

TEST(Placement, HostsOfDifferentSizesHaveNoNodeSize) {
  // 3 ranks on one host, 5 on the other: consecutive, but no L fits both.
  const std::vector<int> uneven = {0, 0, 0, 3, 3, 3, 3, 3};
  const Placement p = placement_of(uneven);
  EXPECT_EQ(p.ranks_per_host, 0);
  EXPECT_FALSE(p.consecutive);
  EXPECT_EQ(p.detail, "2 hosts: ranks 0, 1, 2 on one host, ranks 3, 4, 5, 6, 7 on another");
  // Many hosts and ranks: the first two described, the ranks cut after six.
  std::vector<int> big(32);
  for (int r = 0; r < 32; ++r) big[static_cast<size_t>(r)] = r % 4;
  EXPECT_EQ(placement_of(big).detail,
            "4 hosts: ranks 0, 4, 8, 12, 16, 20, ... on one host, ranks 1, 5, 9, 13, 17, 21, ... on another, ...");
}

}  // namespace
}  // namespace emu
