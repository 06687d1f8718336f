// The safetensors weight format: reading with full validation, and atomic writing.
//
// Layout of a file:
//   bytes [0, 8)          N, the header length, unsigned 64-bit little-endian
//   bytes [8, 8 + N)      a JSON object: for each tensor name {"dtype": "F32", "shape": [2, 3],
//                         "data_offsets": [begin, end]}, plus optionally "__metadata__": {string: string};
//                         may be padded with trailing spaces
//   bytes [8 + N, end)    the data section; a tensor's bytes are [begin, end) of it, row-major, little-endian
// The tensors' byte ranges must cover the data section exactly: no gaps, no overlaps, nothing after the last.
//
// The reader checks all of this (header length against the file and a 100 MB bound, well-formed JSON, known
// dtypes, shape × dtype size equal to the byte range, offsets in range and contiguous, no duplicate names) and
// throws InputError naming the file and the problem: it never trusts the file, so it can be fuzzed.
// The writer writes `path.tmp.<pid>` and renames it over `path`, so a file is either complete or absent.
//
// Which model parameter has which Hugging Face name is the model's business, not this file's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace emu::io {

enum class SafetensorsDType : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64
};

// "F32", "BF16", …, as the header spells them.
std::string_view safetensors_dtype_name(SafetensorsDType dtype);
size_t safetensors_dtype_size(SafetensorsDType dtype);
std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view name);

struct SafetensorsTensor {
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;    // empty for a scalar
  std::vector<std::byte> bytes;  // elements() · dtype size bytes, row-major, little-endian

  uint64_t elements() const;
  // The values as fp32, for F32, BF16 and F16 tensors; InputError for any other dtype.
  std::vector<float> to_float() const;
};

struct SafetensorsFile {
  std::string source;  // the file it came from, for messages
  std::map<std::string, SafetensorsTensor, std::less<>> tensors;
  std::map<std::string, std::string, std::less<>> metadata;

  const SafetensorsTensor* find(std::string_view name) const;
  // InputError naming the file and the missing tensor.
  const SafetensorsTensor& at(std::string_view name) const;
};

// Reads and validates a whole file; InputError on anything wrong, naming the file.
SafetensorsFile read_safetensors(const std::filesystem::path& path);
// The same for a file already in memory; `source` names it in messages.
SafetensorsFile parse_safetensors(std::span<const std::byte> contents, std::string_view source);

// A tensor to write: its bytes are not copied.
struct TensorView {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;  // elements · dtype size bytes
};

// The file's contents, tensors laid out in the order given. InputError for an empty, reserved ("__metadata__")
// or duplicate name, a negative dimension, or bytes that do not match shape × dtype size.
std::vector<std::byte> serialize_safetensors(std::span<const TensorView> tensors,
                                             const std::map<std::string, std::string, std::less<>>& metadata = {});
// Serialises, then writes atomically (see above). InputError naming the path if it cannot be written; no
// temporary file is left behind.
void write_safetensors(const std::filesystem::path& path, std::span<const TensorView> tensors,
                       const std::map<std::string, std::string, std::less<>>& metadata = {});

// Views of fp32 values and of bf16 bit patterns as tensor bytes.
std::span<const std::byte> tensor_bytes(std::span<const float> values);
std::span<const std::byte> tensor_bytes(std::span<const uint16_t> values);

}  // namespace emu::io
