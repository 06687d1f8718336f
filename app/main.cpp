// The emu executable: validate the command line on every rank and agree on the verdict, run every strategy,
// print the report on rank 0, write the requested files, and exit with a code a CI job can act on.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "app/advisor.h"
#include "app/atomic_file.h"
#include "app/header.h"
#include "app/interrupt.h"
#include "app/json_report.h"
#include "app/options.h"
#include "app/plan.h"
#include "app/report.h"
#include "app/run.h"
#include "app/svg.h"
#include "app/trace.h"
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
      std::fprintf(stderr, "emu: (found on %d of %d ranks, first on rank %d)\n", agreed.ranks_with_error, mpi.world(),
                   agreed.first_rank);
    }
  }
  return emu::kExitBadInput;
}

// What rank 0 says if a signal ends the job now: the strategies finished (their results in the JSON), the one
// running, the ones not run.
void note_progress(const emu::app::RunReport& so_far) {
  std::vector<std::string> finished;
  for (const emu::app::StrategyOutcome& outcome : so_far.outcomes) finished.push_back(outcome.name);
  std::vector<std::string> waiting;
  for (size_t i = finished.size(); i < so_far.options.strategies.size(); ++i) {
    waiting.push_back(so_far.options.strategies[i].name());
  }
  const std::string json = so_far.options.json_path;
  std::string note = finished.empty() ? "no strategy had finished"
                                      : fmt::format("finished {}{}", fmt::join(finished, ", "),
                                                    json.empty() ? "" : fmt::format(" (results in {})", json));
  if (!waiting.empty()) {
    note += fmt::format("; {} was running", waiting.front());
    if (waiting.size() > 1) {
      note += fmt::format(", not run: {}", fmt::join(waiting.begin() + 1, waiting.end(), ", "));
    }
  }
  emu::app::set_interrupt_note(note);
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
                     outcome.fits() ? "fits" : emu::app::oom_summary(report, outcome).c_str());
      }
    }
  }
  return failed == 0 ? emu::kExitOk : emu::kExitExpectationFailed;
}

// --find-limit: rank 0 searches and prints; every rank returns the same code.
int find_limits(const emu::MpiSession& mpi, const emu::app::RunOptions& options) {
  std::string error;
  if (mpi.rank() == 0) {
    try {
      const auto limits = emu::app::find_limits(options, mpi.world(), mpi.local_size(), options.find_limit);
      std::fputs(emu::app::format_limits(options, mpi.world(), options.find_limit, limits).c_str(), stdout);
      std::fflush(stdout);
      if (!options.json_path.empty()) {
        emu::app::write_file_atomically(options.json_path,
                                        emu::app::format_limits_json(options, mpi.world(), options.find_limit, limits));
      }
    } catch (const emu::InputError& e) {
      error = e.what();
    }
  }
  if (const auto agreed = emu::agree_on_error(error)) return bad_input(mpi, *agreed);
  return emu::kExitOk;
}

// Strict mode: stop every rank at once, as a GPU job would. An expected outcome, not emu's own failure: the message
// is the OOM at full scale, without a source location.
[[noreturn]] void strict_out_of_memory(const emu::OutOfMemoryError& error, int shrink) {
  const auto k = static_cast<uint64_t>(shrink);
  std::fprintf(stderr, "%s --strict-oom stops the job here (exit %d).\n", error.event().message(k * k).c_str(),
               static_cast<int>(emu::kExitExpectationFailed));
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, emu::kExitExpectationFailed);
  std::_Exit(emu::kExitExpectationFailed);
}

// Rank 0: the report on stdout, the advice when nothing fit or it was asked for, then the files asked for; an
// error writing them, or "".
std::string print_and_write(const emu::MpiSession& mpi, const emu::app::RunOptions& options,
                            const emu::app::RunReport& report) {
  std::fputs(emu::app::format_report(report).c_str(), stdout);
  std::fputs(emu::app::format_conclusion(report).c_str(), stdout);
  std::fflush(stdout);
  std::optional<emu::app::Advice> advice;
  if (emu::app::should_advise(report)) {
    advice = emu::app::advise(report, mpi.world(), mpi.local_size());
    std::fputs(emu::app::format_advice(*advice).c_str(), stdout);
    std::fflush(stdout);
  }
  try {
    if (!options.json_path.empty()) {
      emu::app::write_file_atomically(options.json_path, emu::app::format_json(report, advice ? &*advice : nullptr));
    }
    if (!options.trace_path.empty())
      emu::app::write_file_atomically(options.trace_path, emu::app::format_trace(report));
    if (!options.svg_path.empty()) {
      emu::app::write_file_atomically(options.svg_path, emu::app::format_memory_svg(report));
    }
  } catch (const emu::InputError& error) {
    return error.what();
  }
  return "";
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
  emu::log::phase_end("MPI_Init and the command line");
  if (const auto agreed = emu::agree_on_error(input_error)) return bad_input(mpi, *agreed);
  if (parsed.action == emu::app::ParsedCommandLine::Action::kPrintAndExit) {
    if (mpi.rank() == 0) std::fputs(parsed.text_to_print.c_str(), stdout);
    return emu::kExitOk;
  }
  const emu::app::RunOptions& options = parsed.options;
  if (mpi.rank() == 0) {
    for (const std::string& warning : options.warnings) emu::log::warn("app", "{}", warning);  // once per job
  }
  emu::app::print_run_header(mpi, options);
  emu::log::phase_end("header");

  // Ctrl-C or SIGTERM: rank 0 says which strategies finished; the JSON, rewritten after each one, holds them.
  emu::app::install_interrupt_handlers();
  const auto after_each = [&](const emu::app::RunReport& so_far) {
    if (mpi.rank() != 0) return;
    note_progress(so_far);
    if (so_far.complete || options.json_path.empty()) return;
    try {
      emu::app::write_file_atomically(options.json_path, emu::app::format_json(so_far));
    } catch (const emu::InputError& error) {
      emu::log::warn("app", "the JSON so far was not written: {}", error.what());  // the final write says why
    }
  };
  if (mpi.rank() == 0) {
    emu::app::RunReport nothing_yet;
    nothing_yet.options = options;
    note_progress(nothing_yet);
  }
  emu::app::RunReport report;
  if (options.plan) {
    // Rank 0 plans alone, for any number of ranks; the others wait for its verdict.
    std::string plan_error;
    if (mpi.rank() == 0) {
      try {
        if (!options.find_limit.empty()) return find_limits(mpi, options);
        report = emu::app::plan_strategies(options, mpi.world(), mpi.local_size(), after_each);
      } catch (const emu::InputError& error) {
        plan_error = error.what();
      }
    } else if (!options.find_limit.empty()) {
      return find_limits(mpi, options);
    }
    if (const auto agreed = emu::agree_on_error(plan_error)) return bad_input(mpi, *agreed);
  } else {
    try {
      report = emu::app::run_strategies(mpi, options, after_each);
    } catch (const emu::OutOfMemoryError& error) {
      strict_out_of_memory(error, options.shrink);
    }
  }
  const std::string write_error = mpi.rank() == 0 ? print_and_write(mpi, options, report) : "";
  emu::log::phase_end("report and files");
  if (const auto agreed = emu::agree_on_error(write_error)) return bad_input(mpi, *agreed);
  // Rank 0 holds every outcome (a plan's only there); its verdict is everyone's.
  int code = mpi.rank() == 0 ? check_expectations(report, 0) : emu::kExitOk;
  if (mpi.rank() == 0 && !report.plan && !report.outcomes.empty()) {
    // A fault asked for and never struck would let a fault test pass without testing anything.
    const std::string unfired =
        emu::app::unfired_faults(options.faults, report.outcomes.front().name, report.outcomes.front().steps_run);
    if (!unfired.empty()) {
      std::fputs(unfired.c_str(), stderr);
      code = emu::kExitExpectationFailed;
    }
  }
  EMU_MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD));
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  int code = emu::kExitOk;
  {
    emu::MpiSession mpi(argc, argv);
    code = emu::run_guarded(mpi, "emu", [&] { return run(mpi, argc, argv); });
  }
  emu::log::phase_end("MPI_Finalize");
  return code;
}
