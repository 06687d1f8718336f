// A small MPI program that misbehaves on purpose, started by coll_watchdog_test under mpiexec:
//   hang      the last rank never joins the second all-reduce; the watchdog (2 s) must end the job, exit code 3
//   mismatch  in checking mode rank 0 broadcasts while the others all-reduce; the check must name them, exit 3
//   ok        everyone behaves; exit 0
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "collectives/mpi/mpi_communicator.h"
#include "emu/mpi_env.h"

int main(int argc, char** argv) {
  emu::MpiSession mpi(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "ok";
  emu::MemoryPool::Options memory;
  memory.rank = mpi.rank();
  auto device = emu::make_cpu_device(memory);
  emu::coll::CommunicatorOptions options;
  options.watchdog_seconds = 2.0;
  options.check_calls = mode == "mismatch";
  auto comm = emu::coll::make_mpi_communicator(MPI_COMM_WORLD, *device, "world", options);
  std::vector<float> data(1000, 1.0f);
  comm->all_reduce(data.data(), data.data(), data.size(), emu::DType::kF32, emu::coll::ReduceOp::kSum, "warm-up");
  if (mode == "hang") {
    if (mpi.rank() == mpi.world() - 1) std::this_thread::sleep_for(std::chrono::seconds(60));
    comm->all_reduce(data.data(), data.data(), data.size(), emu::DType::kF32, emu::coll::ReduceOp::kSum,
                     "backward reduce, unit 7");
  } else if (mode == "mismatch") {
    if (mpi.rank() == 0) {
      comm->broadcast(data.data(), data.data(), data.size(), emu::DType::kF32, 0, "step 3");
    } else {
      comm->all_reduce(data.data(), data.data(), data.size(), emu::DType::kF32, emu::coll::ReduceOp::kSum, "step 3");
    }
  }
  return 0;
}
