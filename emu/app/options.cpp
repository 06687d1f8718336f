#include "emu/app/options.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "emu/check.h"
#include "emu/log.h"
#include "emu/units.h"

namespace emu::app {
namespace {

constexpr int kMaxShrink = 4096;

uint64_t parse_reserve(const std::string& text) {
  const CapSpec spec = parse_cap_spec(text == "0" ? "1B" : text);
  if (spec.unlimited || spec.scaled || !spec.gpu.empty()) {
    throw InputError(fmt::format("--reserve '{}' must be a plain size such as 1GiB, 512MB or 0", text));
  }
  return text == "0" ? 0 : spec.bytes;
}

}  // namespace

ParsedCommandLine parse_command_line(int argc, const char* const* argv) {
  ParsedCommandLine parsed;
  RunOptions& options = parsed.options;
  std::string cap_text = "none";

  CLI::App app{
      "emu: each MPI rank emulates one GPU with a hard memory cap and trains a scaled-down transformer under "
      "DDP, ZeRO and FSDP with real collectives.\n\nThe canonical run:  mpirun -np 8 ./emu --cap 40GB-scaled",
      "emu"};
  app.set_version_flag("--version", fmt::format("emu {}", EMU_VERSION));
  app.add_option("--cap", cap_text, "memory per emulated GPU: " + cap_spec_help())->capture_default_str();
  app.add_option("--shrink,-k", options.shrink,
                 "shrink factor k: hidden, FFN, vocabulary and sequence length are divided by k, every memory "
                 "term by k^2")
      ->capture_default_str();
  app.add_option("--reserve", options.reserve_text,
                 "fixed overheads per GPU at full scale (CUDA context, NCCL buffers), inside the cap; divided by "
                 "k^2 like everything else")
      ->capture_default_str();
  app.add_flag("--strict-oom", options.strict_oom,
               "abort at the first allocation past the cap, as a GPU would, instead of finishing the step over the "
               "cap and reporting what it would have needed");
  app.add_option("--log", options.log_spec, "log levels, e.g. 'info' or 'coll=trace,warn' (also EMU_LOG)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) {
      parsed.action = ParsedCommandLine::Action::kPrintAndExit;
      parsed.text_to_print = dynamic_cast<const CLI::CallForVersion*>(&error) != nullptr
                                 ? fmt::format("emu {}\n", EMU_VERSION)
                                 : app.help();
      return parsed;
    }
    throw InputError(fmt::format("{} (see emu --help)", error.what()));
  }

  options.cap = parse_cap_spec(cap_text);
  if (options.shrink < 1 || options.shrink > kMaxShrink) {
    throw InputError(fmt::format("--shrink {} is out of range; accepted: 1 to {}", options.shrink, kMaxShrink));
  }
  options.reserve_full_scale = parse_reserve(options.reserve_text);
  if (!options.log_spec.empty()) log::configure(options.log_spec);
  return parsed;
}

}  // namespace emu::app
