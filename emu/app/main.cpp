// The emu executable: validate the command line on every rank, agree on the verdict, print the run header.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "emu/app/header.h"
#include "emu/app/options.h"
#include "emu/check.h"
#include "emu/log.h"
#include "emu/mpi_env.h"

namespace {

int run(const emu::MpiSession& mpi, int argc, char** argv) {
  emu::app::ParsedCommandLine parsed;
  std::string input_error;
  try {
    if (const char* spec = std::getenv("EMU_LOG")) emu::log::configure(spec);
    parsed = emu::app::parse_command_line(argc, argv);
  } catch (const emu::InputError& error) {
    input_error = error.what();
  }
  if (const auto agreed = emu::agree_on_error(input_error)) {
    emu::log::debug("app", "verdict: bad input (exit {}): {}", static_cast<int>(emu::kExitBadInput), agreed->message);
    if (mpi.rank() == 0) {
      std::fprintf(stderr, "emu: error: %s\n", agreed->message.c_str());
      if (agreed->ranks_with_error != mpi.world()) {
        std::fprintf(stderr, "emu: (found on %d of %d ranks, first on rank %d)\n", agreed->ranks_with_error,
                     mpi.world(), agreed->first_rank);
      }
    }
    return emu::kExitBadInput;
  }
  if (parsed.action == emu::app::ParsedCommandLine::Action::kPrintAndExit) {
    if (mpi.rank() == 0) std::fputs(parsed.text_to_print.c_str(), stdout);
    return emu::kExitOk;
  }
  emu::app::print_run_header(mpi, parsed.options);
  return emu::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  emu::MpiSession mpi(argc, argv);
  try {
    return run(mpi, argc, argv);
  } catch (const std::exception& error) {
    emu::fatal(fmt::format("unexpected error: {}", error.what()), __FILE__, __LINE__);
  }
}
