// Fuzzes the safetensors reader (workloads/io/safetensors.h) on whole files held in memory. Every tensor of an
// accepted file is also converted to fp32, as loading weights does (InputError for dtypes that cannot be).
#include <cstddef>
#include <cstdint>
#include <span>

#include "tests/fuzz/fuzz_support.h"
#include "workloads/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> contents(reinterpret_cast<const std::byte*>(data), size);
  emu::fuzz::expect_accept_or_input_error("emu::io::parse_safetensors", [&] {
    const emu::io::SafetensorsFile file = emu::io::parse_safetensors(contents, "fuzz-input");
    for (const auto& [name, tensor] : file.tensors) {
      if (tensor.elements() * emu::io::safetensors_dtype_size(tensor.dtype) != tensor.bytes.size()) {
        emu::fuzz::finding("an accepted tensor's bytes do not match its shape and dtype");
      }
      (void)tensor.to_float();
    }
  });
  return 0;
}
