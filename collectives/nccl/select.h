// Choosing the communication library: the one place that knows whether this build has NCCL (DESIGN.md §6).
//
// NCCL is chosen when the build has it (EMU_CUDA=ON), the device is a CUDA device, and every rank of the group
// has a GPU of its own; otherwise MPI (ranks sharing one card, the cpu and shapes backends, CPU-only builds).
//
// Algorithms over NCCL: collectives/reduce.cpp combines partial sums on the host, so our ring/tree/rhd algorithms
// need host-readable buffers. A communicator over NCCL therefore runs every kind on the library pass-through
// (registered as "mpi" in collectives/registry.cpp: it calls Link::native, which here is NCCL's own collective),
// and the ledger is charged with the same nominal volumes the MPI pass-through charges. The algorithm names of an
// algorithm list (emu --collectives) then steer NCCL's own choice through NCCL_ALGO (nccl_algo_setting); an
// NCCL_ALGO already in the environment wins.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <string_view>

#include "collectives/communicator.h"
#include "collectives/link.h"
#include "emu/device.h"

namespace emu::coll {

// "nccl" or "mpi": what make_link would choose for `device` over `comm`. Collective over comm.
std::string choose_library(MPI_Comm comm, const Device& device);

// A Link over `comm` in the chosen library; over NCCL, `algorithms` (an algorithm list) steers NCCL first
// (nccl_algo_setting). Collective over comm.
std::unique_ptr<Link> make_link(MPI_Comm comm, const Device& device, std::string_view algorithms = {});

// NCCL's per-collective NCCL_ALGO value (NCCL 2.24 and later) for an algorithm list such as
// "all_reduce=tree,all_gather=ring": "allreduce:tree;allgather:ring". Kinds left to the library ("mpi", "nccl")
// and kinds NCCL runs point to point (all_to_all, barrier) are left out; empty when nothing is steered. Throws
// InputError for an algorithm NCCL does not run: all_reduce accepts ring and tree, reduce_scatter, all_gather,
// broadcast and reduce accept ring.
std::string nccl_algo_setting(std::string_view algorithms);

// A communicator over make_link(comm, device) running `algorithms` (Communicator::set_algorithms; empty: the
// defaults). Over NCCL, every kind on the pass-through, with `algorithms` steering NCCL (see above).
std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Device& device, std::string name = "world",
                                                CommunicatorOptions options = CommunicatorOptions::from_environment(),
                                                std::string_view algorithms = {});

}  // namespace emu::coll
