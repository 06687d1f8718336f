// MPI set-up for an emu process: initialisation, the rank context, the node-local group, and agreement on errors.
#pragma once

#include <mpi.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace emu {

class MpiSession {
 public:
  // MPI_Init_thread (funneled), errors returned rather than fatal, rank context set for log lines.
  MpiSession(int& argc, char**& argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  // Ranks that share this host (MPI_COMM_TYPE_SHARED), and this rank's place among them.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // How many distinct hosts the job spans.
  int hosts() const { return hosts_; }
  MPI_Comm local_comm() const { return local_comm_; }
  // Every rank's host, as the lowest world rank sharing it (the same on every rank; topology.h placement_of).
  const std::vector<int>& host_of_ranks() const { return host_of_ranks_; }

 private:
  int rank_ = 0, world_ = 1, local_rank_ = 0, local_size_ = 1, hosts_ = 1;
  std::vector<int> host_of_ranks_;
  MPI_Comm local_comm_ = MPI_COMM_NULL;
};

// Every rank passes the error it found (empty: none). Returns the error of the lowest rank that found one,
// together with that rank and how many found one, on every rank, so all ranks reach the same verdict. Collective.
struct AgreedError {
  std::string message;
  int first_rank = 0;
  int ranks_with_error = 0;
};
std::optional<AgreedError> agree_on_error(const std::string& local_error, MPI_Comm comm = MPI_COMM_WORLD);

// Runs an executable's body on every rank and turns what escapes it into an exit code: bad input raised alike on
// every rank after start-up is printed once by rank 0 as "<program>: error: ..." (exit 2); anything else ends every
// rank as an internal error (exit 3).
int run_guarded(const MpiSession& mpi, std::string_view program, const std::function<int()>& body);

}  // namespace emu
