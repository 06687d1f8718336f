#include "emu/topology.h"

#include <fmt/format.h>
#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <vector>

#include "emu/units.h"

namespace emu {
namespace {

// One loaded hwloc topology, destroyed with the scope.
class Topology {
 public:
  Topology() {
    hwloc_topology_init(&topology_);
    hwloc_topology_load(topology_);
  }
  ~Topology() { hwloc_topology_destroy(topology_); }
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;
  hwloc_topology_t get() const { return topology_; }
  int count(hwloc_obj_type_t type) const {
    const int n = hwloc_get_nbobjs_by_type(topology_, type);
    return n < 0 ? 0 : n;
  }

 private:
  hwloc_topology_t topology_ = nullptr;
};

}  // namespace

std::string HostInfo::summary() const {
  return fmt::format("{}: {} package{}, {} NUMA node{}, {} cores, {} hardware threads, {} memory{}", hostname, packages,
                     packages == 1 ? "" : "s", numa_nodes, numa_nodes == 1 ? "" : "s", cores, hardware_threads,
                     format_bytes(memory_bytes), cpu_model.empty() ? "" : ", " + cpu_model);
}

HostInfo describe_host() {
  Topology topology;
  HostInfo info;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) info.hostname = name;
  info.packages = topology.count(HWLOC_OBJ_PACKAGE);
  info.numa_nodes = topology.count(HWLOC_OBJ_NUMANODE);
  info.cores = topology.count(HWLOC_OBJ_CORE);
  info.hardware_threads = topology.count(HWLOC_OBJ_PU);
  hwloc_obj_t root = hwloc_get_root_obj(topology.get());
  // hwloc counts the memory of its NUMA nodes; some virtual machines leave hot-plugged memory outside them, so
  // the kernel's count of physical pages is taken when it is larger.
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  const uint64_t kernel_bytes = pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * page_size : 0;
  info.memory_bytes = std::max<uint64_t>(root->total_memory, kernel_bytes);
  if (const char* model = hwloc_obj_get_info_by_name(root, "CPUModel")) info.cpu_model = model;
  if (info.cpu_model.empty()) {
    hwloc_obj_t package = hwloc_get_obj_by_type(topology.get(), HWLOC_OBJ_PACKAGE, 0);
    if (package != nullptr) {
      if (const char* model = hwloc_obj_get_info_by_name(package, "CPUModel")) info.cpu_model = model;
    }
  }
  return info;
}

Binding bind_to_core(int local_rank, int local_size) {
  Topology topology;
  const int cores = topology.count(HWLOC_OBJ_CORE);
  Binding binding;
  if (cores <= 0 || local_size > cores) {
    binding.oversubscribed = cores > 0;
    binding.detail = fmt::format("not bound: {} ranks share {} cores on this host", local_size, cores);
    return binding;
  }
  hwloc_obj_t core = hwloc_get_obj_by_type(topology.get(), HWLOC_OBJ_CORE, static_cast<unsigned>(local_rank));
  if (core == nullptr || hwloc_set_cpubind(topology.get(), core->cpuset, HWLOC_CPUBIND_PROCESS) != 0) {
    binding.detail = fmt::format("not bound: hwloc could not bind to core {}", local_rank);
    return binding;
  }
  binding.bound = true;
  binding.core = local_rank;
  binding.detail = fmt::format("core {}", local_rank);
  return binding;
}

Placement placement_of(std::span<const int> host_of_rank) {
  // Each host's ranks, hosts in the order of their lowest rank.
  std::vector<std::vector<int>> hosts;
  std::map<int, size_t> index;
  for (size_t r = 0; r < host_of_rank.size(); ++r) {
    const auto [at, added] = index.try_emplace(host_of_rank[r], hosts.size());
    if (added) hosts.emplace_back();
    hosts[at->second].push_back(static_cast<int>(r));
  }
  Placement placement;
  if (hosts.empty()) return placement;
  const size_t per_host = hosts.front().size();
  const bool even = std::all_of(hosts.begin(), hosts.end(), [&](const auto& h) { return h.size() == per_host; });
  placement.ranks_per_host = even ? static_cast<int>(per_host) : 0;
  // Equal hosts whose ranks are each one block of consecutive ranks: host h holds h·L .. h·L + L − 1.
  placement.consecutive = even && std::all_of(hosts.begin(), hosts.end(), [](const std::vector<int>& h) {
                            return h.back() - h.front() + 1 == static_cast<int>(h.size());
                          });
  if (placement.consecutive) return placement;
  const auto ranks = [](const std::vector<int>& h) {
    constexpr size_t kShown = 6;
    const std::vector<int> shown(h.begin(), h.begin() + static_cast<std::ptrdiff_t>(std::min(h.size(), kShown)));
    return fmt::format("{}{}", fmt::join(shown, ", "), h.size() > kShown ? ", ..." : "");
  };
  std::vector<std::string> held;
  for (size_t h = 0; h < hosts.size() && h < 2; ++h)
    held.push_back(fmt::format("ranks {} on {}", ranks(hosts[h]), h == 0 ? "one host" : "another"));
  if (hosts.size() > 2) held.emplace_back("...");
  placement.detail = fmt::format("{} hosts: {}", hosts.size(), fmt::join(held, ", "));
  return placement;
}

}  // namespace emu
