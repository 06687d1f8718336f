// Reading safetensors: every field of the header is checked before any byte of data is trusted.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "emu/bf16.h"
#include "emu/check.h"
#include "emu/dtype.h"
#include "workloads/io/safetensors.h"

namespace emu::io {
namespace {

using Json = nlohmann::json;

// Real headers are well below this (a few hundred bytes per tensor); the bound keeps a corrupt length from
// making us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests no deeper than {"name": {"shape": [..]}}: depth 3. Deeper input is rejected while parsing.
constexpr int kMaxJsonDepth = 3;

// Where one tensor's bytes lie in the data section.
struct Entry {
  std::string name;
  SafetensorsTensor tensor;  // bytes still empty
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;  // sorted by begin
  std::map<std::string, std::string, std::less<>> metadata;
};

// IEEE 754 binary16 to fp32, subnormals, infinities and NaN included.
float half_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | mantissa << 13);
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal (or zero)
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | (exponent + 112) << 23 | mantissa << 13);
}

[[noreturn]] void fail(std::string_view source, std::string_view problem) {
  throw InputError(fmt::format("safetensors file {}: {}", source, problem));
}

// Parses the JSON text, rejecting duplicate keys in any object and nesting deeper than a header needs.
Json parse_json(std::string_view text, std::string_view source) {
  std::vector<std::set<std::string>> keys;  // the keys seen in each open object, innermost last
  std::string problem;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (!problem.empty()) return false;
    if (depth > kMaxJsonDepth) {
      problem = fmt::format("header JSON nests deeper than {} levels", kMaxJsonDepth);
      return false;
    }
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second) {
      problem = fmt::format("duplicate key \"{}\" in the header", parsed.get<std::string>());
      return false;
    }
    return true;
  };
  Json json;
  try {
    json = Json::parse(text.begin(), text.end(), callback);
  } catch (const Json::exception& error) {
    fail(source, fmt::format("header is not valid JSON: {}", error.what()));
  }
  if (!problem.empty()) fail(source, problem);
  return json;
}

// A non-negative integer that fits in uint64_t, or nothing.
std::optional<uint64_t> as_unsigned(const Json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return static_cast<uint64_t>(value.get<int64_t>());
  return std::nullopt;
}

Entry parse_entry(const std::string& name, const Json& info, uint64_t data_size, std::string_view source) {
  const std::string where = fmt::format("tensor \"{}\"", name);
  if (name.empty()) fail(source, "a tensor has an empty name");
  if (!info.is_object()) fail(source, fmt::format("{}: expected an object, got {}", where, info.type_name()));
  for (const auto& [key, value] : info.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail(source, fmt::format("{}: unknown field \"{}\" (expected dtype, shape, data_offsets)", where, key));
    }
  }
  if (!info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets")) {
    fail(source, fmt::format("{}: needs the fields dtype, shape and data_offsets", where));
  }

  Entry entry;
  entry.name = name;
  const Json& dtype = info["dtype"];
  const std::optional<SafetensorsDType> parsed =
      dtype.is_string() ? parse_safetensors_dtype(dtype.get<std::string>()) : std::nullopt;
  if (!parsed) fail(source, fmt::format("{}: unknown dtype {}", where, dtype.dump()));
  entry.tensor.dtype = *parsed;

  const Json& shape = info["shape"];
  if (!shape.is_array()) fail(source, fmt::format("{}: shape must be an array, got {}", where, shape.dump()));
  uint64_t elements = 1;
  bool overflow = false;
  for (const Json& dim : shape) {
    const std::optional<uint64_t> value = as_unsigned(dim);
    if (!value || *value > static_cast<uint64_t>(INT64_MAX)) {
      fail(source, fmt::format("{}: shape {} must hold non-negative integers", where, shape.dump()));
    }
    entry.tensor.shape.push_back(static_cast<int64_t>(*value));
    overflow = overflow || __builtin_mul_overflow(elements, *value, &elements);
  }

  const Json& offsets = info["data_offsets"];
  std::optional<uint64_t> begin, end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = as_unsigned(offsets[0]);
    end = as_unsigned(offsets[1]);
  }
  if (!begin || !end) {
    fail(source, fmt::format("{}: data_offsets {} must be two non-negative integers", where, offsets.dump()));
  }
  if (*begin > *end || *end > data_size) {
    fail(source, fmt::format("{}: data_offsets [{}, {}] are outside the data section of {} bytes", where, *begin, *end,
                             data_size));
  }
  entry.begin = *begin;
  entry.end = *end;

  uint64_t bytes = 0;
  overflow = overflow || __builtin_mul_overflow(elements, safetensors_dtype_size(*parsed), &bytes);
  if (overflow || bytes != *end - *begin) {
    fail(source,
         fmt::format("{}: shape {} of {} needs {} bytes, but data_offsets [{}, {}] hold {}", where, shape.dump(),
                     dtype.get<std::string>(), overflow ? std::string("more than 2^64") : std::to_string(bytes), *begin,
                     *end, *end - *begin));
  }
  return entry;
}

std::map<std::string, std::string, std::less<>> parse_metadata(const Json& metadata, std::string_view source) {
  if (!metadata.is_object()) fail(source, fmt::format("__metadata__ must be an object, got {}", metadata.type_name()));
  std::map<std::string, std::string, std::less<>> result;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) {
      fail(source, fmt::format("__metadata__ value of \"{}\" must be a string, got {}", key, value.type_name()));
    }
    result.emplace(key, value.get<std::string>());
  }
  return result;
}

// The entries must tile [0, data_size) in order: each begins where the previous ended.
void check_contiguous(const std::vector<Entry>& entries, uint64_t data_size, std::string_view source) {
  uint64_t expected = 0;
  const Entry* previous = nullptr;
  for (const Entry& entry : entries) {
    if (entry.begin < expected) {
      fail(source, fmt::format("tensors \"{}\" [{}, {}) and \"{}\" [{}, {}) overlap", previous->name, previous->begin,
                               previous->end, entry.name, entry.begin, entry.end));
    }
    if (entry.begin > expected) {
      fail(source, fmt::format("bytes [{}, {}) of the data section belong to no tensor (before \"{}\")", expected,
                               entry.begin, entry.name));
    }
    expected = entry.end;
    previous = &entry;
  }
  if (expected != data_size) {
    fail(source, fmt::format("bytes [{}, {}) at the end of the data section belong to no tensor", expected, data_size));
  }
}

Header parse_header(std::string_view text, uint64_t data_size, std::string_view source) {
  const Json json = parse_json(text, source);
  if (!json.is_object()) fail(source, fmt::format("header must be a JSON object, got {}", json.type_name()));
  Header header;
  for (const auto& [name, info] : json.items()) {
    if (name == "__metadata__") {
      header.metadata = parse_metadata(info, source);
    } else {
      header.entries.push_back(parse_entry(name, info, data_size, source));
    }
  }
  std::sort(header.entries.begin(), header.entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  check_contiguous(header.entries, data_size, source);
  return header;
}

// Checks the 8-byte prefix against the file size; returns the header length.
uint64_t header_length(std::span<const std::byte> prefix, uint64_t file_size, std::string_view source) {
  if (file_size < 8) fail(source, fmt::format("truncated: {} bytes, but the header length alone takes 8", file_size));
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = length << 8 | std::to_integer<uint64_t>(prefix[static_cast<size_t>(i)]);
  if (length < 2 || length > kMaxHeaderBytes) {
    fail(source, fmt::format("header length {} is outside [2, {}] bytes", length, kMaxHeaderBytes));
  }
  if (length > file_size - 8) {
    fail(source, fmt::format("header length {} runs past the end of the file ({} bytes after the length)", length,
                             file_size - 8));
  }
  return length;
}

SafetensorsFile assemble(Header header, std::string_view source) {
  SafetensorsFile file;
  file.source = std::string(source);
  file.metadata = std::move(header.metadata);
  for (Entry& entry : header.entries) file.tensors.emplace(std::move(entry.name), std::move(entry.tensor));
  return file;
}

}  // namespace

SafetensorsFile parse_safetensors(std::span<const std::byte> contents, std::string_view source) {
  const uint64_t length = header_length(contents, contents.size(), source);
  const std::string_view text(reinterpret_cast<const char*>(contents.data()) + 8, static_cast<size_t>(length));
  const uint64_t data_size = contents.size() - 8 - length;
  Header header = parse_header(text, data_size, source);
  const std::span<const std::byte> data = contents.subspan(static_cast<size_t>(8 + length));
  for (Entry& entry : header.entries) {
    const auto bytes = data.subspan(static_cast<size_t>(entry.begin), static_cast<size_t>(entry.end - entry.begin));
    entry.tensor.bytes.assign(bytes.begin(), bytes.end());
  }
  return assemble(std::move(header), source);
}

SafetensorsFile read_safetensors(const std::filesystem::path& path) {
  const std::string source = path.string();
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) fail(source, "does not exist or is not a regular file");
  const uint64_t file_size = std::filesystem::file_size(path, error);
  if (error) fail(source, fmt::format("cannot read its size: {}", error.message()));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(source, fmt::format("cannot open: {}", std::strerror(errno)));

  std::array<std::byte, 8> prefix{};
  if (file_size >= 8) in.read(reinterpret_cast<char*>(prefix.data()), 8);
  const uint64_t length = header_length(prefix, file_size, source);
  std::string text(static_cast<size_t>(length), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(length))) fail(source, "read of the header failed");
  Header header = parse_header(text, file_size - 8 - length, source);

  // Contiguous entries in offset order: the data section is read front to back, once.
  for (Entry& entry : header.entries) {
    entry.tensor.bytes.resize(static_cast<size_t>(entry.end - entry.begin));
    if (entry.tensor.bytes.empty()) continue;
    if (!in.read(reinterpret_cast<char*>(entry.tensor.bytes.data()),
                 static_cast<std::streamsize>(entry.tensor.bytes.size()))) {
      fail(source, fmt::format("read of tensor \"{}\" failed", entry.name));
    }
  }
  return assemble(std::move(header), source);
}

uint64_t SafetensorsTensor::elements() const {
  uint64_t count = 1;
  for (int64_t dim : shape) count *= static_cast<uint64_t>(dim);
  return count;
}

std::vector<float> SafetensorsTensor::to_float() const {
  static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");
  const size_t count = bytes.size() / safetensors_dtype_size(dtype);
  std::vector<float> values(count);
  switch (dtype) {
    case SafetensorsDType::kF32:
      if (count != 0) std::memcpy(values.data(), bytes.data(), count * 4);
      break;
    case SafetensorsDType::kBF16:
    case SafetensorsDType::kF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, bytes.data() + 2 * i, 2);
        values[i] = dtype == SafetensorsDType::kBF16 ? bf16_to_float(bits) : half_to_float(bits);
      }
      break;
    default:
      throw InputError(fmt::format("tensor of dtype {} cannot be read as float; expected F32, BF16 or F16",
                                   safetensors_dtype_name(dtype)));
  }
  return values;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

const SafetensorsTensor& SafetensorsFile::at(std::string_view name) const {
  const SafetensorsTensor* tensor = find(name);
  if (tensor == nullptr) fail(source, fmt::format("has no tensor \"{}\"", name));
  return *tensor;
}

}  // namespace emu::io
