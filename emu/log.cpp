#include "emu/log.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>
#include <string>

#include "emu/check.h"

namespace emu::log {
namespace {

struct Config {
  Level fallback = Level::kWarn;
  std::map<std::string, Level, std::less<>> modules;
};

Config& config() {
  static Config instance;
  return instance;
}

Level parse_level(std::string_view name) {
  static const std::pair<std::string_view, Level> kLevels[] = {{"trace", Level::kTrace}, {"debug", Level::kDebug},
                                                               {"info", Level::kInfo},   {"warn", Level::kWarn},
                                                               {"error", Level::kError}, {"off", Level::kOff}};
  for (const auto& [text, level] : kLevels) {
    if (name == text) return level;
  }
  throw InputError(fmt::format("log level '{}' is not one of trace, debug, info, warn, error, off", name));
}

const char* level_name(Level level) {
  switch (level) {
    case Level::kTrace: return "trace";
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarn: return "warning";
    case Level::kError: return "error";
    case Level::kOff: break;
  }
  return "";
}

// The process's start, near enough: static initialisation, before main and MPI_Init.
const std::chrono::steady_clock::time_point g_process_start = std::chrono::steady_clock::now();

double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

}  // namespace

void configure(std::string_view spec) {
  Config parsed;
  while (!spec.empty()) {
    const size_t comma = spec.find(',');
    const std::string_view entry = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    if (entry.empty()) continue;
    const size_t equals = entry.find('=');
    if (equals == std::string_view::npos) {
      parsed.fallback = parse_level(entry);
    } else {
      parsed.modules[std::string(entry.substr(0, equals))] = parse_level(entry.substr(equals + 1));
    }
  }
  config() = std::move(parsed);
}

bool enabled(std::string_view module, Level level) {
  const Config& current = config();
  const auto it = current.modules.find(module);
  const Level threshold = it == current.modules.end() ? current.fallback : it->second;
  return level >= threshold && level != Level::kOff;
}

void write(std::string_view module, Level level, std::string_view message) {
  static std::mutex mutex;
  const std::string line = level >= Level::kWarn
                               ? fmt::format("{} {}: {}: {}\n", rank_tag(), module, level_name(level), message)
                               : fmt::format("{} {}: {}\n", rank_tag(), module, message);
  std::lock_guard lock(mutex);
  std::fputs(line.c_str(), stderr);
}

void phase_end(std::string_view phase) {
  if (!enabled("time", Level::kInfo)) return;
  static double last_wall = 0.0;
  static double last_cpu = 0.0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_process_start).count();
  const double cpu = cpu_seconds();
  write("time", Level::kInfo,
        fmt::format("{}: wall {:.3f} s (+{:.3f}), CPU {:.3f} s (+{:.3f})", phase, wall, wall - last_wall, cpu,
                    cpu - last_cpu));
  last_wall = wall;
  last_cpu = cpu;
}

}  // namespace emu::log
