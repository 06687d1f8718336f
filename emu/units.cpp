#include "emu/units.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
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

struct SizeUnit {
  std::string_view name;  // lower case
  uint64_t bytes;
};
constexpr SizeUnit kUnits[] = {{"b", 1},      {"kb", kKB},   {"mb", kMB},   {"gb", kGB},  {"tb", kTB},
                               {"kib", kKiB}, {"mib", kMiB}, {"gib", kGiB}, {"tib", kTiB}};

}  // namespace

std::optional<uint64_t> parse_bytes(std::string_view text) {
  size_t split = 0;
  while (split < text.size() && (std::isdigit(static_cast<unsigned char>(text[split])) || text[split] == '.')) {
    ++split;
  }
  if (split == 0 || split == text.size()) return std::nullopt;
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + split, value);
  if (error != std::errc() || end != text.data() + split || !std::isfinite(value) || value <= 0) return std::nullopt;
  std::string unit(text.substr(split));
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const SizeUnit& candidate : kUnits) {
    if (unit != candidate.name) continue;
    const double total = std::round(value * static_cast<double>(candidate.bytes));
    if (total < 1 || total >= 1.8e19) return std::nullopt;
    return static_cast<uint64_t>(total);
  }
  return std::nullopt;
}

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
