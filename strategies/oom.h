// Out of memory without deadlock (DESIGN.md §2). In record mode a rank that passes its cap notes the first
// allocation that did not fit and finishes the step over the cap on the host, so its peers are never left
// waiting inside a collective. At the step's end every rank calls agree_on_oom: the ranks exchange what they
// recorded and all reach the same verdict, with which ranks ran out, where, and what they would have needed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "emu/memory.h"

namespace emu::strategy {

struct RankMemory {
  int rank = 0;
  bool out_of_memory = false;
  uint64_t cap = 0;
  uint64_t peak = 0;       // what the step needed the device to hold (reserved): above the cap when out_of_memory
  uint64_t requested = 0;  // the first allocation that did not fit
  uint64_t in_use = 0;     // in use when it was asked for
  std::string phase;       // where, e.g. "backward, block 3"
  std::string what;        // the tensor
};

struct OomVerdict {
  std::vector<RankMemory> ranks;  // every rank, in rank order

  bool any() const;
  std::vector<int> failing_ranks() const;
  // "ranks 1, 3 of 4 ran out of memory; rank 1 in backward, block 3 (tried to allocate 1.00 MiB for ..., 3.2 MiB in
  // use of a 4.0 MiB cap), needing 5.1 MiB at the peak, 1.1 MiB more than its cap"
  std::string summary() const;
};

// Collective over `control` (a communicator whose ledger is kept apart from the training traffic). Every rank
// returns the same verdict.
OomVerdict agree_on_oom(const MemoryPool& memory, coll::Communicator& control);

}  // namespace emu::strategy
