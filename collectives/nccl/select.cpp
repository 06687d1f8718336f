#include "collectives/nccl/select.h"

#include <fmt/format.h>

#include <cstdlib>
#include <string_view>
#include <vector>

#include "collectives/mpi/mpi_communicator.h"
#include "emu/check.h"

#if defined(EMU_CUDA)
#include <cuda_runtime_api.h>

#include "collectives/nccl/nccl_link.h"
#include "emu/cuda/check.h"
#endif

namespace emu::coll {
namespace {

#if defined(EMU_CUDA)
// True when no two ranks of comm on the same node use the same GPU. Collective over comm.
bool every_rank_has_own_gpu(MPI_Comm comm, int gpu) {
  MPI_Comm node = MPI_COMM_NULL;
  EMU_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int size = 0;
  EMU_MPI_CHECK(MPI_Comm_size(node, &size));
  std::vector<int> gpus(static_cast<size_t>(size));
  EMU_MPI_CHECK(MPI_Allgather(&gpu, 1, MPI_INT, gpus.data(), 1, MPI_INT, node));
  EMU_MPI_CHECK(MPI_Comm_free(&node));
  int shared = 0;
  for (size_t i = 0; i < gpus.size(); ++i) {
    for (size_t j = i + 1; j < gpus.size(); ++j) shared |= gpus[i] == gpus[j] ? 1 : 0;
  }
  int any_shared = 0;  // every rank of comm must reach the same choice, whichever node it is on
  EMU_MPI_CHECK(MPI_Allreduce(&shared, &any_shared, 1, MPI_INT, MPI_MAX, comm));
  return any_shared == 0;
}

// NCCL reads NCCL_ALGO when a communicator is made; one set by the user wins over the algorithm list.
void steer_nccl(std::string_view algorithms) {
  const std::string setting = nccl_algo_setting(algorithms);
  if (!setting.empty() && std::getenv("NCCL_ALGO") == nullptr) setenv("NCCL_ALGO", setting.c_str(), 0);
}
#endif

}  // namespace

std::string nccl_algo_setting(std::string_view algorithms) {
  std::string setting;
  for (const auto& [kind, algorithm] : parse_algorithm_list(algorithms)) {
    if (algorithm == "mpi" || algorithm == "nccl" || kind == CollectiveKind::kAllToAll ||
        kind == CollectiveKind::kBarrier)
      continue;
    const bool tree_ok = kind == CollectiveKind::kAllReduce;
    if (algorithm != "ring" && !(tree_ok && algorithm == "tree")) {
      throw InputError(
          fmt::format("{}={}: over NCCL the collectives run inside NCCL, which offers {} for {} "
                      "(or nccl: NCCL's own choice)",
                      kind_name(kind), algorithm, tree_ok ? "ring and tree" : "ring", kind_name(kind)));
    }
    std::string nccl_name(kind_name(kind));
    std::erase(nccl_name, '_');  // all_reduce -> allreduce, as NCCL names its collectives
    setting += fmt::format("{}{}:{}", setting.empty() ? "" : ";", nccl_name, algorithm);
  }
  return setting;
}

std::string choose_library(MPI_Comm comm, const Device& device) {
#if defined(EMU_CUDA)
  int cuda = device.backend() == "cuda" ? 1 : 0, all_cuda = 0;
  EMU_MPI_CHECK(MPI_Allreduce(&cuda, &all_cuda, 1, MPI_INT, MPI_MIN, comm));
  if (all_cuda == 0) return "mpi";
  int gpu = 0;
  EMU_CUDA_CHECK(cudaGetDevice(&gpu));
  return every_rank_has_own_gpu(comm, gpu) ? "nccl" : "mpi";
#else
  (void)comm;
  (void)device;
  return "mpi";
#endif
}

std::unique_ptr<Link> make_link(MPI_Comm comm, const Device& device, std::string_view algorithms) {
#if defined(EMU_CUDA)
  if (choose_library(comm, device) == "nccl") {
    steer_nccl(algorithms);
    int gpu = 0;
    EMU_CUDA_CHECK(cudaGetDevice(&gpu));
    return make_nccl_link(comm, gpu);
  }
#else
  (void)algorithms;
#endif
  return make_mpi_link(comm);
}

std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Device& device, std::string name,
                                                CommunicatorOptions options, std::string_view algorithms) {
  auto link = make_link(comm, device, algorithms);
  const bool nccl = link->library() == "nccl";
  auto communicator = std::make_unique<Communicator>(std::move(link), device, std::move(name), options);
  // Over NCCL every kind runs NCCL's own collective, which the algorithm names have steered (make_link).
  communicator->set_algorithms(
      nccl ? "all_reduce=mpi,reduce_scatter=mpi,all_gather=mpi,broadcast=mpi,reduce=mpi,all_to_all=mpi,barrier=mpi"
           : algorithms);
  return communicator;
}

}  // namespace emu::coll
