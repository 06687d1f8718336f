// The NCCL backend of Link (EMU_CUDA=ON): ncclSend/ncclRecv for our algorithms' exchanges, NCCL's collectives for
// the pass-through, bootstrapped over MPI (rank 0's ncclUniqueId is broadcast on the MPI communicator).
//
// Buffers are the CUDA device's (cudaMalloc or managed). Every call is issued on the link's own stream, which
// is a blocking stream and so ordered after the compute ops issued on the legacy default stream; the call then
// waits for its stream, as Link's calls are synchronous. NCCL needs one GPU per rank: collectives/nccl/select.h
// falls back to the MPI link where ranks share a card.
#pragma once

#include <mpi.h>

#include <memory>

#include "collectives/link.h"

namespace emu::coll {

// Collective over `comm` (duplicated, as make_mpi_link does); `gpu` is this rank's CUDA device.
std::unique_ptr<Link> make_nccl_link(MPI_Comm comm, int gpu);

}  // namespace emu::coll
