#include "emu/mpi_env.h"

#include <cstdio>
#include <exception>
#include <vector>

#include "emu/check.h"

namespace emu {

MpiSession::MpiSession(int& argc, char**& argv) {
  int provided = 0;
  EMU_MPI_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided));
  EMU_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  EMU_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  EMU_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_));
  set_rank_context(rank_, world_);
  EMU_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_comm_));
  EMU_MPI_CHECK(MPI_Comm_rank(local_comm_, &local_rank_));
  EMU_MPI_CHECK(MPI_Comm_size(local_comm_, &local_size_));
  const int leader = local_rank_ == 0 ? 1 : 0;
  EMU_MPI_CHECK(MPI_Allreduce(&leader, &hosts_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  int host = rank_;
  EMU_MPI_CHECK(MPI_Allreduce(&rank_, &host, 1, MPI_INT, MPI_MIN, local_comm_));
  host_of_ranks_.resize(static_cast<size_t>(world_));
  EMU_MPI_CHECK(MPI_Allgather(&host, 1, MPI_INT, host_of_ranks_.data(), 1, MPI_INT, MPI_COMM_WORLD));
}

MpiSession::~MpiSession() {
  if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
  MPI_Finalize();
}

std::optional<AgreedError> agree_on_error(const std::string& local_error, MPI_Comm comm) {
  int rank = 0;
  int world = 1;
  EMU_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  EMU_MPI_CHECK(MPI_Comm_size(comm, &world));
  const int has_error = local_error.empty() ? 0 : 1;
  const int candidate = has_error ? rank : world;
  int first = world;
  int count = 0;
  EMU_MPI_CHECK(MPI_Allreduce(&candidate, &first, 1, MPI_INT, MPI_MIN, comm));
  EMU_MPI_CHECK(MPI_Allreduce(&has_error, &count, 1, MPI_INT, MPI_SUM, comm));
  if (first == world) return std::nullopt;
  int length = rank == first ? static_cast<int>(local_error.size()) : 0;
  EMU_MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, first, comm));
  std::vector<char> text(static_cast<size_t>(length));
  if (rank == first) text.assign(local_error.begin(), local_error.end());
  EMU_MPI_CHECK(MPI_Bcast(text.data(), length, MPI_CHAR, first, comm));
  return AgreedError{std::string(text.begin(), text.end()), first, count};
}

int run_guarded(const MpiSession& mpi, std::string_view program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const InputError& error) {
    if (mpi.rank() == 0)
      std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(program.size()), program.data(), error.what());
    return kExitBadInput;
  } catch (const std::exception& error) {
    fatal(fmt::format("unexpected error: {}", error.what()), __FILE__, __LINE__);
  }
}

}  // namespace emu
