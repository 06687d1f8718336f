// Byte counts as people read them. GB means 10^9 and GiB means 2^30; emu never mixes them silently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace emu {

inline constexpr uint64_t kKB = 1000ull, kMB = 1000ull * kKB, kGB = 1000ull * kMB, kTB = 1000ull * kGB;
inline constexpr uint64_t kKiB = 1ull << 10, kMiB = 1ull << 20, kGiB = 1ull << 30, kTiB = 1ull << 40;

// "1.50 GiB", "512 B": binary units, as PyTorch prints memory.
std::string format_bytes(uint64_t bytes);
// Signed variant for deltas.
std::string format_bytes_signed(int64_t bytes);
// "40.00 GB": decimal units, as GPU datasheets print capacity.
std::string format_bytes_decimal(uint64_t bytes);

// "39.59GiB", "150MB", "512KiB", "1000000B" (units in any case; GB = 10^9, GiB = 2^30) -> bytes, rounded to the
// nearest byte; empty unless a positive number with one of those units. The one size parser of emu and its tools.
std::optional<uint64_t> parse_bytes(std::string_view text);

}  // namespace emu
