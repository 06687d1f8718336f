// The host as hwloc sees it, and where each rank runs on it.
#pragma once

#include <cstdint>
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

}  // namespace emu
