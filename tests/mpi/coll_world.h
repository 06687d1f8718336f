// Shared set-up for the collectives' MPI tests: a device and a world communicator per test. The communicator's
// options come from the environment unless a test passes its own, so EMU_COLL_TIMEOUT (set for every MPI test by
// cmake/EmuTesting.cmake) arms the watchdog: a collective that hangs ends the test with a message naming it,
// instead of waiting for ctest's timeout.
#pragma once

#include <mpi.h>

#include <memory>

#include "collectives/mpi/mpi_communicator.h"
#include "emu/device.h"

namespace emu::coll::testing {

struct World {
  std::unique_ptr<Device> device;
  std::unique_ptr<Communicator> comm;

  explicit World(CommunicatorOptions options = CommunicatorOptions::from_environment()) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MemoryPool::Options memory;
    memory.rank = rank;
    device = make_cpu_device(memory);
    comm = make_mpi_communicator(MPI_COMM_WORLD, *device, "world", options);
  }
};

}  // namespace emu::coll::testing
