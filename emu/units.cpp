#include "emu/units.h"

#include <fmt/format.h>

#include <cstdlib>

namespace emu {
namespace {
std::string scaled(double value, const char* const* names, double base) {
  int unit = 0;
  while (value >= base && names[unit + 1] != nullptr) {
    value /= base;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} {}", value, names[0]) : fmt::format("{:.2f} {}", value, names[unit]);
}
}  // namespace

std::string format_bytes(uint64_t bytes) {
  static const char* const kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", nullptr};
  return scaled(static_cast<double>(bytes), kNames, 1024.0);
}

std::string format_bytes_signed(int64_t bytes) {
  const std::string magnitude = format_bytes(static_cast<uint64_t>(std::llabs(bytes)));
  return bytes < 0 ? "-" + magnitude : magnitude;
}

std::string format_bytes_decimal(uint64_t bytes) {
  static const char* const kNames[] = {"B", "KB", "MB", "GB", "TB", "PB", nullptr};
  return scaled(static_cast<double>(bytes), kNames, 1000.0);
}

}  // namespace emu
