// Cap specifications: how much memory each emulated GPU has.
//
//   40GB, 40GiB, 39.59GiB, 150MB, 1000000B   a size; GB = 10^9, GiB = 2^30
//   none                                     no cap
//   a100-40gb, a100-80gb, h100-80gb          a named GPU, at the capacity PyTorch reports for it
//   <any of the above>-scaled                divided by k^2, k the model's shrink factor (DESIGN.md §1)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace emu {

struct NamedGpu {
  std::string_view name;
  std::string_view description;
  uint64_t usable_bytes;  // what torch.cuda.get_device_properties().total_memory reports
};
const std::vector<NamedGpu>& named_gpus();

struct CapSpec {
  std::string text;        // as given
  bool unlimited = false;  // "none"
  uint64_t bytes = 0;      // the stated capacity, before any shrinking
  bool scaled = false;     // "-scaled": divide by k^2
  std::string gpu;         // the named GPU, if one was given

  // The cap of one shrunk rank, for shrink factor k. kNoCap when unlimited.
  uint64_t per_rank_bytes(int shrink) const;
  // What the per-rank cap stands for at full scale (x k^2). kNoCap when unlimited.
  uint64_t full_scale_bytes(int shrink) const;
  // "40.00 GB / 64^2 = 9.77 MB" or "none": the arithmetic, for the run header.
  std::string describe(int shrink) const;
};

// Throws InputError naming the bad text and listing every accepted form.
CapSpec parse_cap_spec(std::string_view text);
std::string cap_spec_help();

}  // namespace emu
