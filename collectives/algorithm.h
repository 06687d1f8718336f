// A collective algorithm: how it runs, what it declares it will move, and the typed table of all of them.
//
// One algorithm per file in algorithms/, each defining one `const Algorithm`; registry.cpp lists them. The
// dispatch point (communicator.cpp) picks one per kind by name, runs it with an AlgorithmContext, and charges the
// ledger with what the AlgorithmContext counted and what expect() declared; the two must agree to the byte.
#pragma once

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/link.h"
#include "collectives/types.h"
#include "emu/device.h"

namespace emu::coll {

// One exchange as the teaching view shows it: which block went to whom, what came back and whether it was reduced.
struct StepRecord {
  std::string stage;  // e.g. "reduce-scatter step 2/3"
  int to = kNoPeer;
  int send_block = -1;  // -1: not a block of the partition (the whole buffer, a half, ...)
  uint64_t send_bytes = 0;
  int from = kNoPeer;
  int recv_block = -1;
  uint64_t recv_bytes = 0;
  bool reduced = false;  // the received data was combined with ours rather than copied
  // Where the sent and received elements lie in the collective's buffer, when not a block of the partition or the
  // whole buffer (halving-doubling's halves); -1 otherwise.
  int64_t send_offset = -1;
  int64_t recv_offset = -1;
};

// Elements in one slice (at least 1).
inline size_t slice_elements(size_t slice_bytes, DType dtype) {
  const size_t elements = slice_bytes / dtype_size(dtype);
  return elements == 0 ? 1 : elements;
}

// The ranks of a node: consecutive ranks fill a node (rank r is on node r / L, L = ranks_per_node), as mpirun's
// default by-slot mapping and torchrun's global rank (node rank × processes per node + local rank) place them. L of 0,
// or not below the group's size N, puts the whole group on one node.
constexpr int node_size(int ranks_per_node, int n) {
  return ranks_per_node <= 0 || ranks_per_node >= n ? n : ranks_per_node;
}

// What an algorithm runs with: the link, the device its buffers come from, and the counters.
struct AlgorithmContext {
  Link& link;
  Device& device;
  size_t slice_bytes;  // the largest message; reductions go through scratch buffers of at most this size
  // The slice a scratch buffer is charged for: slice_bytes / k² in a shrunk run (CommunicatorOptions::shrink).
  size_t charged_slice_bytes;
  Traffic moved;                              // counted by the helpers in steps.h
  std::vector<StepRecord>* record = nullptr;  // the teaching view's log, or null
  int ranks_per_node = 0;                     // CommunicatorOptions::ranks_per_node (0: one node)
  Traffic moved_between_nodes;                // the part of `moved` exchanged with ranks of other nodes

  int rank() const { return link.rank(); }
  int size() const { return link.size(); }
  int node_of(int r) const { return r / node_size(ranks_per_node, size()); }
  // A communication buffer of `count` elements, charged to the cap (Category::kCommBuffers). May throw
  // OutOfMemoryError.
  Buffer buffer(size_t count, DType dtype, std::string_view what) {
    return device.allocate(count, dtype, Category::kCommBuffers, what);
  }
  // Scratch of `slices` slices for messages of at most `largest` elements: slices × min(largest, slice) elements,
  // charged as slices × min(largest, charged slice) elements, what the full-scale GPU holds ÷ k². Same throws.
  Buffer scratch(size_t largest, size_t slices, DType dtype, std::string_view what) {
    const size_t held = slices * std::min(largest, slice_elements(slice_bytes, dtype));
    const size_t charged = slices * std::min(largest, slice_elements(charged_slice_bytes, dtype));
    return device.allocate(held, dtype, Category::kCommBuffers, what, charged * dtype_size(dtype));
  }
};

// What an algorithm declares for one call on one rank.
struct Expectation {
  Traffic traffic;            // bytes sent and received through point-to-point
  uint64_t buffer_bytes = 0;  // communication buffers it allocates (their sum; all live at once)
  // The part of `traffic` exchanged with ranks of other nodes, where the algorithm states it (the hierarchical
  // all-reduce, whose point is to send less of it); empty for the flat algorithms.
  std::optional<Traffic> between_nodes;
};

// The α-β-γ cost of one call (Hockney's model, as Thakur, Rabenseifner and Gropp, "Optimization of collective
// communication operations in MPICH", 2005, apply it): time = rounds·α + bytes·β + reduced·γ, with α the latency
// of one message, β the time per byte over a link and γ the time per byte of reduction. `bytes` and `reduced` are
// on the critical path: what the busiest rank sends or receives one message after another (links are full duplex,
// so a round that sends b bytes and receives b bytes costs b·β) and what it adds. Each algorithm states its closed
// form from its own schedule; coll-teach checks the rounds and bytes against the exchanges it really made.
//
// An algorithm that keeps the links within a node apart from those between nodes (hier) also states which part of
// its rounds and bytes goes between nodes (`split`); cost.h charges that part at the slower link and the rest at the
// node's. A flat algorithm states no split: spread over several nodes, each of its steps waits on some message
// between nodes, so all of it is charged at the slower link (as NCCL's tuning model, src/graph/tuning.cc, takes a
// ring's bandwidth across nodes from the network's).
struct Cost {
  double rounds = 0;         // α terms (all of them, the inter-node ones included)
  double bytes = 0;          // β terms (bytes)
  double reduced = 0;        // γ terms (bytes)
  std::string_view formula;  // e.g. "2(N-1) α + 2(N-1)/N S β + (N-1)/N S γ"
  bool split = false;        // the two below are stated
  double inter_rounds = 0;   // the part of `rounds` whose messages go between nodes
  double inter_bytes = 0;    // the part of `bytes` that goes between nodes
};

struct Algorithm {
  CollectiveKind kind;
  std::string_view name;     // "ring", "tree", "rhd", "mpi", ...
  std::string_view summary;  // one line for --help and the README
  void (*run)(AlgorithmContext& context, const Call& call);
  // ranks_per_node: as CommunicatorOptions (0: one node); the flat algorithms ignore it.
  Expectation (*expect)(const Call& call, int rank, int size, size_t slice_bytes, int ranks_per_node);
  // The cost of a call moving a payload of S bytes (payload_bytes: the buffer for all-reduce, broadcast and
  // reduce, the whole output or input for all-gather, reduce-scatter and all-to-all) over N ranks, L of them per
  // node; null where the algorithm is not ours to state (MPI's own chooses at run time).
  Cost (*cost)(double payload, int size, int ranks_per_node);
  // The cost with the payload cut into pieces of at most `slice_bytes`, for an algorithm whose pieces pipeline (the
  // ring reduce's chain: N+k−2 rounds for k pieces, not k times one piece's N−1); null where `cost` is the one to
  // use at any slice.
  Cost (*sliced_cost)(double payload, int size, int ranks_per_node, double slice_bytes) = nullptr;
};

// Every registered algorithm, grouped by kind, the default of each kind first.
std::span<const Algorithm* const> algorithms();
std::vector<const Algorithm*> algorithms_for(CollectiveKind kind);
// Null if there is none of that name for `kind`.
const Algorithm* find_algorithm(CollectiveKind kind, std::string_view name);
// "ring, rhd, mpi"
std::string algorithm_names(CollectiveKind kind);

}  // namespace emu::coll
