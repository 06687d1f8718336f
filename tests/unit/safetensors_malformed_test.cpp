// safetensors: a table of malformed files, each rejected with an InputError that names the file and the problem,
// from memory and from disk; and a small fuzz: every truncation and many random corruptions of a valid file are
// either parsed or rejected with InputError, never a crash or another exception.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "emu/check.h"
#include "workloads/io/safetensors.h"

namespace emu::io {
namespace {

namespace fs = std::filesystem;

// A file whose header is `json` and whose data section is `data_size` zero bytes.
std::string file_with(const std::string& json, size_t data_size) {
  std::string contents(8, '\0');
  const uint64_t length = json.size();
  for (size_t i = 0; i < 8; ++i) contents[i] = static_cast<char>(length >> (8 * i) & 0xffu);
  return contents + json + std::string(data_size, '\0');
}

std::string length_only(uint64_t length, size_t extra) {
  std::string contents(8, '\0');
  for (size_t i = 0; i < 8; ++i) contents[i] = static_cast<char>(length >> (8 * i) & 0xffu);
  return contents + std::string(extra, '{');
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + name + "\": {\"dtype\": \"" + dtype + "\", \"shape\": " + shape + ", \"data_offsets\": [" +
         std::to_string(begin) + ", " + std::to_string(end) + "]}";
}

std::vector<std::byte> bytes_of(const std::string& text) {
  std::vector<std::byte> bytes(text.size());
  if (!text.empty()) std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

struct Malformed {
  const char* what;
  std::string contents;
  const char* expected;  // part of the message
};

std::vector<Malformed> malformed_files() {
  const std::string a = entry("a", "F32", "[2]", 0, 8);
  return {
      {"empty file", "", "truncated"},
      {"truncated length", std::string(5, '\0'), "truncated"},
      {"header length zero", length_only(0, 10), "header length 0"},
      {"header length past the end", length_only(1000, 20), "past the end"},
      {"header length huge", length_only(~uint64_t{0}, 20), "outside"},
      {"header cut short", file_with("{" + a + "}", 8).substr(0, 20), "past the end"},
      {"bad JSON", file_with("{\"a\": {\"dtype\": ", 0), "not valid JSON"},
      {"trailing garbage after the JSON", file_with("{} x", 0), "not valid JSON"},
      {"invalid UTF-8", file_with("{\"\xff\xfe\": 1}", 0), "not valid JSON"},
      {"header not an object", file_with("[1, 2]", 0), "must be a JSON object"},
      {"entry not an object", file_with("{\"a\": 5}", 0), "expected an object"},
      {"empty tensor name", file_with("{" + entry("", "F32", "[1]", 0, 4) + "}", 4), "empty name"},
      {"missing field", file_with(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", 4), "needs the fields"},
      {"unknown field", file_with(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}})", 4),
       "unknown field"},
      {"unknown dtype", file_with("{" + entry("a", "F128", "[1]", 0, 16) + "}", 16), "unknown dtype"},
      {"dtype not a string", file_with(R"({"a": {"dtype": 4, "shape": [1], "data_offsets": [0, 4]}})", 4),
       "unknown dtype"},
      {"negative dimension", file_with("{" + entry("a", "F32", "[-1]", 0, 4) + "}", 4), "non-negative"},
      {"fractional dimension", file_with("{" + entry("a", "F32", "[1.5]", 0, 4) + "}", 4), "non-negative"},
      {"shape not an array", file_with("{" + entry("a", "F32", "4", 0, 4) + "}", 4), "must be an array"},
      {"shape overflows", file_with("{" + entry("a", "F32", "[4294967296, 4294967296, 16]", 0, 4) + "}", 4),
       "more than 2^64"},
      {"offsets out of range", file_with("{" + entry("a", "F32", "[2]", 0, 8) + "}", 4), "outside the data"},
      {"offsets reversed", file_with("{" + entry("a", "F32", "[0]", 4, 0) + "}", 4), "outside the data"},
      {"offsets not two integers", file_with(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4),
       "two non-negative integers"},
      {"negative offset", file_with(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4),
       "two non-negative integers"},
      {"wrong size for shape", file_with("{" + entry("a", "F32", "[3]", 0, 8) + "}", 8), "needs 12 bytes"},
      {"bf16 size mismatch", file_with("{" + entry("a", "BF16", "[3]", 0, 8) + "}", 8), "needs 6 bytes"},
      {"overlapping tensors", file_with("{" + a + ", " + entry("b", "F32", "[2]", 4, 12) + "}", 12), "overlap"},
      {"gap between tensors",
       file_with("{" + entry("a", "F32", "[1]", 0, 4) + ", " + entry("b", "F32", "[1]", 8, 12) + "}", 12),
       "belong to no tensor"},
      {"bytes after the last tensor", file_with("{" + a + "}", 12), "belong to no tensor"},
      {"duplicate name", file_with("{" + a + ", " + entry("a", "F32", "[2]", 8, 16) + "}", 16), "duplicate key \"a\""},
      {"duplicate field",
       file_with(R"({"a": {"dtype": "F32", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4),
       "duplicate key \"dtype\""},
      {"metadata not an object", file_with(R"({"__metadata__": [1]})", 0), "__metadata__ must be an object"},
      {"metadata value not a string", file_with(R"({"__metadata__": {"k": 1}})", 0), "must be a string"},
      {"deep nesting", file_with(std::string(100000, '[') + std::string(100000, ']'), 0), "nests deeper"},
  };
}

TEST(SafetensorsMalformed, EachIsRejectedWithANamedReason) {
  for (const Malformed& bad : malformed_files()) {
    try {
      parse_safetensors(bytes_of(bad.contents), "bad.safetensors");
      ADD_FAILURE() << bad.what << ": accepted";
    } catch (const InputError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("bad.safetensors"), std::string::npos) << bad.what << ": " << message;
      EXPECT_NE(message.find(bad.expected), std::string::npos) << bad.what << ": " << message;
    }
  }
}

TEST(SafetensorsMalformed, ReadingFromDiskRejectsTheSameFiles) {
  const fs::path dir = fs::temp_directory_path() / ("emu_safetensors_malformed." + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const Malformed& bad : malformed_files()) {
    const fs::path path = dir / "bad.safetensors";
    std::ofstream(path, std::ios::binary).write(bad.contents.data(), static_cast<std::streamsize>(bad.contents.size()));
    try {
      read_safetensors(path);
      ADD_FAILURE() << bad.what << ": accepted";
    } catch (const InputError& error) {
      EXPECT_NE(std::string(error.what()).find(bad.expected), std::string::npos) << bad.what << ": " << error.what();
    }
  }
  EXPECT_THROW(read_safetensors(dir / "missing.safetensors"), InputError);
  EXPECT_THROW(read_safetensors(dir), InputError);
  fs::remove_all(dir);
}

// Parses `contents`; true if accepted, false if rejected with InputError. Any other outcome fails the test.
bool accepted(const std::string& contents) {
  try {
    parse_safetensors(bytes_of(contents), "fuzz");
    return true;
  } catch (const InputError&) {
    return false;
  }
}

TEST(SafetensorsMalformed, TruncationsAndCorruptionsNeverCrash) {
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  const std::vector<TensorView> tensors = {{"w", SafetensorsDType::kF32, {2, 3}, tensor_bytes(values)},
                                           {"b", SafetensorsDType::kBF16, {4}, tensor_bytes(values).subspan(0, 8)}};
  const std::vector<std::byte> valid = serialize_safetensors(tensors, {{"k", "v"}});
  const std::string original(reinterpret_cast<const char*>(valid.data()), valid.size());
  ASSERT_TRUE(accepted(original));
  for (size_t length = 0; length < original.size(); ++length) {
    EXPECT_FALSE(accepted(original.substr(0, length))) << "truncated to " << length << " bytes";
  }
  std::mt19937 generator(2024);
  std::uniform_int_distribution<size_t> position(0, original.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  const std::string specials = "{}[]\":,0123456789-e. ";
  for (int trial = 0; trial < 3000; ++trial) {
    std::string corrupt = original;
    for (int flips = 1 + trial % 3; flips > 0; --flips) {
      const size_t at = position(generator);
      corrupt[at] = trial % 2 == 0 ? static_cast<char>(byte(generator))
                                   : specials[static_cast<size_t>(byte(generator)) % specials.size()];
    }
    accepted(corrupt);
  }
}

}  // namespace
}  // namespace emu::io
