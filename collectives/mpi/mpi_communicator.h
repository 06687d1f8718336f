// The MPI backend: a Link over an MPI communicator, and a Communicator built on it.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "collectives/link.h"

namespace emu::coll {

// Duplicates `comm` (MPI_Comm_dup, collective), so our messages never match the caller's; the Link frees the
// duplicate. Errors return to the caller and end the job through EMU_MPI_CHECK with MPI's error text.
std::unique_ptr<Link> make_mpi_link(MPI_Comm comm);

// A communicator over `comm`, its buffers from `device`. Collective over comm.
std::unique_ptr<Communicator> make_mpi_communicator(
    MPI_Comm comm, Device& device, std::string name = "world",
    CommunicatorOptions options = CommunicatorOptions::from_environment());

}  // namespace emu::coll
