#include "emu/cap_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "emu/check.h"
#include "emu/memory.h"
#include "emu/units.h"

namespace emu {
namespace {

constexpr std::string_view kScaledSuffix = "-scaled";

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

uint64_t gib(double value) { return static_cast<uint64_t>(std::llround(value * static_cast<double>(kGiB))); }

}  // namespace

const std::vector<NamedGpu>& named_gpus() {
  static const std::vector<NamedGpu> kGpus = {
      {"a100-40gb", "NVIDIA A100 40GB", gib(39.59)},
      {"a100-80gb", "NVIDIA A100 80GB", gib(79.15)},
      {"h100-80gb", "NVIDIA H100 80GB", gib(79.19)},
  };
  return kGpus;
}

std::string cap_spec_help() {
  std::string gpus;
  for (const NamedGpu& gpu : named_gpus()) {
    gpus += fmt::format("{}{} = {}", gpus.empty() ? "" : ", ", gpu.name, format_bytes(gpu.usable_bytes));
  }
  return fmt::format(
      "a size with a unit (40GB, 40GiB, 39.59GiB, 150MB, 512KiB, 1000000B; GB = 10^9 bytes, GiB = 2^30), "
      "'none', a GPU name ({}), or any of these but 'none' followed by '-scaled' to divide by k^2 "
      "(k = the shrink factor)",
      gpus);
}

CapSpec parse_cap_spec(std::string_view text) {
  CapSpec spec;
  spec.text = std::string(text);
  std::string body = lower(text);
  if (body.size() > kScaledSuffix.size() && body.ends_with(kScaledSuffix)) {
    spec.scaled = true;
    body.resize(body.size() - kScaledSuffix.size());
  }
  if (body == "none" && !spec.scaled) {
    spec.unlimited = true;
    return spec;
  }
  for (const NamedGpu& gpu : named_gpus()) {
    if (body == gpu.name) {
      spec.gpu = std::string(gpu.name);
      spec.bytes = gpu.usable_bytes;
      return spec;
    }
  }
  if (const std::optional<uint64_t> bytes = parse_bytes(body)) {
    spec.bytes = *bytes;
    return spec;
  }
  throw InputError(fmt::format("--cap '{}' is not a cap specification; accepted: {}", text, cap_spec_help()));
}

uint64_t CapSpec::per_rank_bytes(int shrink) const {
  if (unlimited) return kNoCap;
  if (!scaled) return bytes;
  const uint64_t k2 = static_cast<uint64_t>(shrink) * static_cast<uint64_t>(shrink);
  return bytes / k2;
}

uint64_t CapSpec::full_scale_bytes(int shrink) const {
  if (unlimited) return kNoCap;
  const uint64_t k2 = static_cast<uint64_t>(shrink) * static_cast<uint64_t>(shrink);
  return per_rank_bytes(shrink) * k2;
}

std::string CapSpec::describe(int shrink) const {
  if (unlimited) return "none (no cap)";
  const std::string stated = gpu.empty() ? fmt::format("{} ({} bytes)", format_bytes(bytes), bytes)
                                         : fmt::format("{} ({}, {} bytes)", gpu, format_bytes(bytes), bytes);
  if (!scaled)
    return fmt::format("{} per rank, stands for {} at full scale (x {}^2)", stated,
                       format_bytes(full_scale_bytes(shrink)), shrink);
  return fmt::format("{} / {}^2 = {} ({} bytes) per rank", stated, shrink, format_bytes(per_rank_bytes(shrink)),
                     per_rank_bytes(shrink));
}

}  // namespace emu
