// Choosing the communication library: the one place that knows whether this build has NCCL (DESIGN.md §6).
//
// NCCL is chosen when the build has it (EMU_CUDA=ON), the device is a CUDA device, and every rank of the group
// has a GPU of its own; otherwise MPI (ranks sharing one card, the cpu and shapes backends, CPU-only builds).
//
// Algorithms over NCCL: collectives/reduce.cpp combines partial sums on the host, so our ring/tree/rhd algorithms
// need host-readable buffers; over cudaMalloc'ed buffers they would need device reductions (not written yet). A
// communicator over NCCL therefore starts with every kind on the library pass-through (registered as "mpi"
// in collectives/registry.cpp: it calls Link::native, which here is NCCL's own collective), and the ledger is
// charged with the same nominal volumes the MPI pass-through charges. Which algorithm NCCL runs inside is NCCL's
// choice, steered by the environment: EMU_NCCL_ALGO=ring|tree sets NCCL_ALGO=Ring|Tree before the communicator
// is made (an NCCL_ALGO already set wins).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "collectives/link.h"
#include "emu/device.h"

namespace emu::coll {

// "nccl" or "mpi": what make_link would choose for `device` over `comm`. Collective over comm.
std::string choose_library(MPI_Comm comm, const Device& device);

// A Link over `comm` in the chosen library. Collective over comm.
std::unique_ptr<Link> make_link(MPI_Comm comm, const Device& device);

// A communicator over make_link(comm, device); over NCCL, every kind on the pass-through (see above).
std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Device& device, std::string name = "world",
                                                Options options = Options::from_environment());

}  // namespace emu::coll
