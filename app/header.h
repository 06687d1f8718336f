// The run header rank 0 prints first: ranks and hosts, the cap per rank shrunk and full-scale, the host
// topology and where each rank runs.
#pragma once

#include "app/options.h"
#include "emu/mpi_env.h"
#include "workloads/model/shrink.h"

namespace emu::app {

// Collective: binds each rank to a core where there are enough, gathers the bindings, prints on rank 0.
void print_run_header(const MpiSession& mpi, const RunOptions& options);

// The shrink report of the run's model by k, its memory terms as the listed strategies' model keeps them
// (strategy::framework_model_options: ddp's and ddp-zero's mixed recipe runs it under autocast). A term that differs
// between the strategies run under autocast and the others gets a line "  under ddp's autocast" below it.
model::ShrinkReport run_shrink_report(const RunOptions& options, int64_t k);

}  // namespace emu::app
