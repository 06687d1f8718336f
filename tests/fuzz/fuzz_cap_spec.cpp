// Fuzzes the --cap specification parser (emu/cap_spec.h): the input is the text after --cap. An accepted cap
// must also describe itself and convert at any shrink factor the command line allows without tripping UBSan.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "emu/cap_spec.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  emu::fuzz::expect_accept_or_input_error("emu::parse_cap_spec", [&] {
    const emu::CapSpec spec = emu::parse_cap_spec(text);
    for (const int shrink : {1, 64, 4096}) {
      (void)spec.per_rank_bytes(shrink);
      (void)spec.full_scale_bytes(shrink);
      (void)spec.describe(shrink);
    }
  });
  return 0;
}
