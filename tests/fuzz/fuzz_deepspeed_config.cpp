// Fuzzes the DeepSpeed JSON config reader (app/deepspeed.h) on the file's text, applied over the default
// strategy options as `emu --deepspeed FILE` does.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "app/deepspeed.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  static const emu::strategy::StrategyOptions defaults;
  emu::fuzz::expect_accept_or_input_error("emu::app::parse_deepspeed_config", [&] {
    (void)emu::app::parse_deepspeed_config(text, "fuzz-input", defaults);
  });
  return 0;
}
