// The emu executable: validate the command line on every rank and agree on the verdict, run every strategy,
// print the report on rank 0, write the requested files, and exit with a code a CI job can act on.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "emu/app/atomic_file.h"
#include "emu/app/header.h"
#include "emu/app/json_report.h"
#include "emu/app/options.h"
#include "emu/app/report.h"
#include "emu/app/run.h"
#include "emu/check.h"
#include "emu/log.h"
#include "emu/mpi_env.h"

namespace {

// Rank 0 prints `message` once; every rank returns kExitBadInput.
int bad_input(const emu::MpiSession& mpi, const emu::AgreedError& agreed) {
  emu::log::debug("app", "verdict: bad input (exit {}): {}", static_cast<int>(emu::kExitBadInput), agreed.message);
  if (mpi.rank() == 0) {
    std::fprintf(stderr, "emu: error: %s\n", agreed.message.c_str());
    if (agreed.ranks_with_error != mpi.world()) {
      std::fprintf(stderr, "emu: (found on %d of %d ranks, first on rank %d)\n", agreed.ranks_with_error,
                   mpi.world(), agreed.first_rank);
    }
  }
  return emu::kExitBadInput;
}

// Exit code 1 when a verdict the user expected did not come out.
int check_expectations(const emu::app::RunReport& report, int rank) {
  int failed = 0;
  for (const emu::app::Expectation& expectation : report.options.expectations) {
    for (const emu::app::StrategyOutcome& outcome : report.outcomes) {
      if (expectation.strategy != "all" && expectation.strategy != outcome.name) continue;
      if (outcome.fits() == expectation.fit) continue;
      ++failed;
      if (rank == 0) {
        std::fprintf(stderr, "emu: expectation failed: %s was expected to %s but %s\n", outcome.name.c_str(),
                     expectation.fit ? "fit" : "run out of memory",
                     outcome.fits() ? "fits" : outcome.verdict.summary().c_str());
      }
    }
  }
  return failed == 0 ? emu::kExitOk : emu::kExitExpectationFailed;
}

int run(const emu::MpiSession& mpi, int argc, char** argv) {
  emu::app::ParsedCommandLine parsed;
  std::string input_error;
  try {
    if (const char* spec = std::getenv("EMU_LOG")) emu::log::configure(spec);
    parsed = emu::app::parse_command_line(argc, argv, mpi.world());
  } catch (const emu::InputError& error) {
    input_error = error.what();
  }
  if (const auto agreed = emu::agree_on_error(input_error)) return bad_input(mpi, *agreed);
  if (parsed.action == emu::app::ParsedCommandLine::Action::kPrintAndExit) {
    if (mpi.rank() == 0) std::fputs(parsed.text_to_print.c_str(), stdout);
    return emu::kExitOk;
  }
  const emu::app::RunOptions& options = parsed.options;
  emu::app::print_run_header(mpi, options);

  emu::app::RunReport report;
  try {
    report = emu::app::run_strategies(mpi, options);
  } catch (const emu::OutOfMemoryError& error) {
    // Strict mode: stop every rank at once, as a GPU job would.
    emu::fatal(fmt::format("out of memory (strict): {}", error.what()), __FILE__, __LINE__,
               emu::kExitExpectationFailed);
  }
  std::string write_error;
  if (mpi.rank() == 0) {
    std::fputs(emu::app::format_report(report).c_str(), stdout);
    std::fputs(emu::app::format_conclusion(report).c_str(), stdout);
    std::fflush(stdout);
    try {
      if (!options.json_path.empty()) emu::app::write_file_atomically(options.json_path, emu::app::format_json(report));
    } catch (const emu::InputError& error) {
      write_error = error.what();
    }
  }
  if (const auto agreed = emu::agree_on_error(write_error)) return bad_input(mpi, *agreed);
  return check_expectations(report, mpi.rank());
}

}  // namespace

int main(int argc, char** argv) {
  emu::MpiSession mpi(argc, argv);
  try {
    return run(mpi, argc, argv);
  } catch (const emu::InputError& error) {
    // Raised after start-up validation by every rank alike (e.g. a model the chosen shrink cannot build).
    if (mpi.rank() == 0) std::fprintf(stderr, "emu: error: %s\n", error.what());
    return emu::kExitBadInput;
  } catch (const std::exception& error) {
    emu::fatal(fmt::format("unexpected error: {}", error.what()), __FILE__, __LINE__);
  }
}
