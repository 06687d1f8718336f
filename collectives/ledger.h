// The traffic ledger: per rank and per group, what each collective kind moved in each caller-named phase.
//
// An entry is keyed by (kind, phase), the phase being the label the caller passes with each call (e.g.
// "backward reduce-scatter, unit 7"). It holds the calls, the bytes this rank sent and received through
// point-to-point, the bytes the algorithm declared it would move (they must be equal; tests check it), and the
// wall time inside the calls. Each communicator keeps its own ledger, named after its group ("world",
// "intra-node 0", ...), so a split's traffic is never mixed into its parent's.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "collectives/types.h"

namespace emu::coll {

struct LedgerEntry {
  uint64_t calls = 0;
  Traffic moved;     // counted at the point-to-point calls the algorithm made
  Traffic expected;  // what the algorithm declared for these calls
  double seconds = 0;
  Traffic between_nodes;  // the part of `moved` exchanged with other nodes' ranks (CommunicatorOptions::ranks_per_node)
  uint64_t payload = 0;   // Σ over the calls of their payload S (types.h payload_bytes), what the cost formulas take
  LedgerEntry& operator+=(const LedgerEntry& other);
};

class Ledger {
 public:
  using Key = std::pair<CollectiveKind, std::string>;
  // Orders keys by kind then phase, and finds them by a (kind, string_view) without building a string.
  struct KeyLess {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      if (a.first != b.first) return a.first < b.first;
      return std::string_view(a.second) < std::string_view(b.second);
    }
  };
  using Entries = std::map<Key, LedgerEntry, KeyLess>;

  explicit Ledger(std::string group) : group_(std::move(group)) {}

  void charge(CollectiveKind kind, std::string_view phase, const Traffic& moved, const Traffic& expected,
              double seconds, const Traffic& between_nodes = {}, uint64_t payload = 0);
  void reset() { entries_.clear(); }

  const std::string& group() const { return group_; }
  // Entries in (kind, phase) order.
  const Entries& entries() const { return entries_; }
  // One phase of one kind; a zero entry if there were no such calls.
  LedgerEntry at(CollectiveKind kind, std::string_view phase) const;
  // All phases of one kind.
  LedgerEntry total(CollectiveKind kind) const;
  // Everything.
  LedgerEntry total() const;
  // A table for people: kind, phase, calls, sent, received, expected, time.
  std::string format() const;

 private:
  std::string group_;
  Entries entries_;
};

}  // namespace emu::coll
