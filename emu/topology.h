// The host as hwloc sees it, and where each rank runs on it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace emu {

struct HostInfo {
  std::string hostname;
  int packages = 0;
  int numa_nodes = 0;
  int cores = 0;
  int hardware_threads = 0;
  uint64_t memory_bytes = 0;
  std::string cpu_model;
  // "1 package, 1 NUMA node, 2 cores, 2 hardware threads, 23.4 GiB"
  std::string summary() const;
};
HostInfo describe_host();

struct Binding {
  bool bound = false;           // pinned to one core
  bool oversubscribed = false;  // more ranks on this host than cores
  int core = -1;                // the core index, when bound
  std::string detail;           // "core 1" or "not bound: 8 ranks share 2 cores"
};
// Pins rank `local_rank` of `local_size` ranks on this host to core local_rank when there are enough cores;
// otherwise leaves it unbound and says it is oversubscribed.
Binding bind_to_core(int local_rank, int local_size);

// How a job's ranks sit on its hosts, from each rank's host (host_of_rank[r]: any id the ranks of one host share;
// MpiSession gathers MPI_COMM_TYPE_SHARED's). What emu's nodes need: every host holding L ranks, and host h holding
// ranks h·L .. h·L + L − 1 (collectives/algorithm.h, node_size), as mpirun's default --map-by slot and torchrun's
// global ranks place them; mpirun --map-by node deals ranks round-robin and does not.
struct Placement {
  int ranks_per_host = 0;    // the ranks on each host; 0 when hosts hold different numbers
  bool consecutive = false;  // and each host's ranks are one block of consecutive ranks
  // When not consecutive: what the hosts hold, e.g. "4 hosts: ranks 0, 4 on one host, ranks 1, 5 on another, ...".
  std::string detail;
};
Placement placement_of(std::span<const int> host_of_rank);

}  // namespace emu
