// Rank-aware logging, tunable per module.
//
//   EMU_LOG=debug            every module at debug
//   EMU_LOG=coll=trace,info  the "coll" module at trace, the others at info
//
// Lines go to stderr as "[r3/8] coll: message". Tables and reports go to stdout, from rank 0, and not through here.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace emu::log {

enum class Level : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarn = 3, kError = 4, kOff = 5 };

// Parses a level list like "coll=trace,info"; throws InputError naming the bad entry.
void configure(std::string_view spec);
bool enabled(std::string_view module, Level level);
void write(std::string_view module, Level level, std::string_view message);

// EMU_LOG=time=info: one line per phase of a run as it ends, "[r0/8] time: <phase>: wall 1.234 s (+0.056),
// CPU 0.987 s (+0.043)": wall seconds since the process started and this rank's CPU seconds (user + system), each
// with the phase's own share. Where a run spends its time (README, Speed); off by default, and costs nothing then.
void phase_end(std::string_view phase);

template <typename... Args>
void at(Level level, std::string_view module, fmt::format_string<Args...> format, Args&&... args) {
  if (enabled(module, level)) write(module, level, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void trace(std::string_view module, fmt::format_string<Args...> format, Args&&... args) {
  at(Level::kTrace, module, format, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(std::string_view module, fmt::format_string<Args...> format, Args&&... args) {
  at(Level::kDebug, module, format, std::forward<Args>(args)...);
}
template <typename... Args>
void info(std::string_view module, fmt::format_string<Args...> format, Args&&... args) {
  at(Level::kInfo, module, format, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(std::string_view module, fmt::format_string<Args...> format, Args&&... args) {
  at(Level::kWarn, module, format, std::forward<Args>(args)...);
}
template <typename... Args>
void error(std::string_view module, fmt::format_string<Args...> format, Args&&... args) {
  at(Level::kError, module, format, std::forward<Args>(args)...);
}

}  // namespace emu::log
