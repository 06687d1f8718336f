// The seam between the collectives and a communication library: this rank's point-to-point view of its group.
//
// Our algorithms (ring, tree, rhd, ...) are written only against Link, so they run unchanged over any library
// that can send and receive bytes: MPI today (mpi/mpi_link.h), NCCL's send/recv in a CUDA build. The library's
// own collectives are reached through native(), which the "mpi" pass-through algorithm uses. A Link counts
// nothing; the algorithms' helpers (steps.h) count the bytes for the ledger.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "collectives/types.h"

namespace emu::coll {

inline constexpr int kNoPeer = -1;

class Link {
 public:
  virtual ~Link() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The library's name, e.g. "mpi"; the pass-through algorithm is registered under it.
  virtual std::string_view library() const = 0;

  // Sends send_bytes to `to` while receiving recv_bytes from `from`; returns when both are done. A side whose
  // peer is kNoPeer is skipped. The two ranks of an exchange must agree on the sizes.
  virtual void exchange(const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes, int from) = 0;

  // The library's own collective for `call` (all kinds but send and recv), with the communicator's semantics
  // (see types.h); ReduceOp::kAvg arrives here as kSum, the caller scales afterwards.
  virtual void native(const Call& call) = 0;

  // Every rank contributes `bytes` bytes; all receive all of them in rank order. Used for checks, never counted.
  virtual void gather_all(const void* mine, size_t bytes, void* all) = 0;

  // The ranks with the same colour form a new group, ordered by key then by rank (MPI_Comm_split semantics).
  virtual std::unique_ptr<Link> split(int color, int key) = 0;
};

}  // namespace emu::coll
