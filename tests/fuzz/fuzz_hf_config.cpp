// Fuzzes the Hugging Face config.json reader (workloads/model/config.h). load_hf_config takes a path, so each
// input is written to this process's scratch file first. An accepted config has passed validate(); the derived
// shapes every later stage uses are computed too, so an overflow there shows up under UBSan.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_support.h"
#include "workloads/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static emu::fuzz::ScratchFile scratch("hf_config.json");
  const auto& path = scratch.write(data, size);
  emu::fuzz::expect_accept_or_input_error("emu::model::load_hf_config", [&] {
    const emu::model::ModelConfig config = emu::model::load_hf_config(path);
    (void)config.head_dim();
    (void)config.kv_dim();
    (void)config.tokens();
  });
  return 0;
}
