// Checks, typed errors and the rank context every log line and error message carries.
//
// Checks stay on in release builds. A failed check names the rank, the condition, file:line and a hint, then
// ends every rank (MPI_Abort with exit code 3), so no peer is left waiting inside a collective. Bad user input is
// an InputError (exit code 2) and is validated the same way on every rank.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace emu {

// Exit codes a CI job can act on (DESIGN.md §7).
enum ExitCode : int {
  kExitOk = 0,
  kExitExpectationFailed = 1,
  kExitBadInput = 2,
  kExitInternal = 3,
};

// Which rank this process is, for log lines and messages. Set once MPI is up; rank 0 of 1 before that.
struct RankContext {
  int rank = 0;
  int world = 1;
};
const RankContext& rank_context();
void set_rank_context(int rank, int world);
// "[r3/8]"
std::string rank_tag();

// Bad user input: the message names the bad value and what is accepted. Leads to exit code 2.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Prints "[rR/N] emu: fatal: <what> (file:line)" to stderr and ends every rank with `code`.
[[noreturn]] void fatal(const std::string& what, const char* file, int line, int code = kExitInternal);

}  // namespace emu

// EMU_CHECK(cond, "format {}", args...): on failure, ends every rank with exit code 3.
#define EMU_CHECK(cond, ...)                                                                                   \
  do {                                                                                                         \
    if (!(cond)) [[unlikely]] {                                                                                \
      ::emu::fatal(std::string("check failed: " #cond ": ") + ::fmt::format(__VA_ARGS__), __FILE__, __LINE__); \
    }                                                                                                          \
  } while (0)

// EMU_MPI_CHECK(MPI_Call(...)): on an MPI error, names the call and MPI's error string, ends every rank.
#define EMU_MPI_CHECK(call)                                                                \
  do {                                                                                     \
    int emu_mpi_rc_ = (call);                                                              \
    if (emu_mpi_rc_ != 0) [[unlikely]] {                                                   \
      ::emu::fatal(::emu::detail::mpi_error_text(#call, emu_mpi_rc_), __FILE__, __LINE__); \
    }                                                                                      \
  } while (0)

namespace emu::detail {
std::string mpi_error_text(const char* call, int rc);
}
