#include "emu/log.h"

#include <cstdio>
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

}  // namespace emu::log
