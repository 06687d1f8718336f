// The run header rank 0 prints first: ranks and hosts, the cap per rank shrunk and full-scale, the host
// topology and where each rank runs.
#pragma once

#include "app/options.h"
#include "emu/mpi_env.h"

namespace emu::app {

// Collective: binds each rank to a core where there are enough, gathers the bindings, prints on rank 0.
void print_run_header(const MpiSession& mpi, const RunOptions& options);

}  // namespace emu::app
