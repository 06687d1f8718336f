// Bytes this process hands to MPI's point-to-point calls, counted at the MPI profiling layer: the library defines
// MPI_Send, MPI_Isend, MPI_Sendrecv, MPI_Recv and MPI_Irecv, counts and calls PMPI_*. Linked only into the test
// that uses it (an object library, so the definitions win over libmpi's at link time). A ledger compared with these
// counts is measured at the boundary to MPI rather than declared by the code that fills it.
//
// What it cannot see: MPI's own collectives. Open MPI's MPI_Allreduce and friends (coll/tuned, coll/basic) move
// their bytes through the internal point-to-point layer (the PML), below the profiling interface, so a pass-through
// collective shows 0 bytes here.
#pragma once

#include <cstdint>

namespace emu::testing {

struct PmpiBytes {
  uint64_t sent = 0;      // payload of sends to a real peer (MPI_PROC_NULL excluded)
  uint64_t received = 0;  // payload actually received (status count; posted count for MPI_Irecv)
};

// Since the start of the process or the last reset.
PmpiBytes pmpi_bytes();
void pmpi_reset();

}  // namespace emu::testing
