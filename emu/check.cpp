#include "emu/check.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

namespace emu {
namespace {
RankContext g_rank_context;
}

const RankContext& rank_context() { return g_rank_context; }

void set_rank_context(int rank, int world) { g_rank_context = RankContext{rank, world}; }

std::string rank_tag() { return fmt::format("[r{}/{}]", g_rank_context.rank, g_rank_context.world); }

void fatal(const std::string& what, const char* file, int line, int code) {
  std::fprintf(stderr, "%s emu: fatal: %s (%s:%d)\n", rank_tag().c_str(), what.c_str(), file, line);
  std::fflush(stderr);
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

namespace detail {
std::string mpi_error_text(const char* call, int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) length = 0;
  return fmt::format("{} returned {} ({})", call, rc, std::string(text, static_cast<size_t>(length)));
}
}  // namespace detail

}  // namespace emu
