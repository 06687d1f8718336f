// safetensors: F32 and BF16 tensors and metadata survive a write and a read, F16 reads as float, files written
// by hand (as another tool would) parse, and writes are atomic: a failed write leaves no file, partial or
// temporary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "emu/bf16.h"
#include "emu/check.h"
#include "emu/dtype.h"
#include "workloads/io/safetensors.h"

namespace emu::io {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("emu_safetensors_test." + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Names of the files in `dir`.
  static std::vector<std::string> listing(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

std::vector<std::byte> as_bytes(const std::string& text) {
  std::vector<std::byte> bytes(text.size());
  if (!text.empty()) std::memcpy(bytes.data(), text.data(), text.size());
  return bytes;
}

TEST_F(SafetensorsTest, F32AndBf16TensorsAndMetadataRoundTrip) {
  const std::vector<float> matrix = {1.0f, -2.5f, 3.25f, 0.0f, 1e-30f, -7.0f};
  std::vector<uint16_t> vector_bf16;
  for (float value : {0.5f, -1.0f, 3.0f, 1024.0f}) vector_bf16.push_back(float_to_bf16(value));
  const std::vector<float> scalar = {42.0f};
  const std::vector<TensorView> tensors = {
      {"model.layers.0.mlp.weight", SafetensorsDType::kF32, {2, 3}, tensor_bytes(matrix)},
      {"norm.weight", SafetensorsDType::kBF16, {4}, tensor_bytes(vector_bf16)},
      {"scale", SafetensorsDType::kF32, {}, tensor_bytes(scalar)},
      {"empty", SafetensorsDType::kF32, {0, 3}, {}},
  };
  const std::map<std::string, std::string, std::less<>> metadata = {{"format", "pt"}, {"step", "17"}};
  const fs::path path = dir_ / "model.safetensors";
  write_safetensors(path, tensors, metadata);

  const SafetensorsFile file = read_safetensors(path);
  EXPECT_EQ(file.source, path.string());
  EXPECT_EQ(file.metadata, metadata);
  ASSERT_EQ(file.tensors.size(), 4u);
  const SafetensorsTensor& weight = file.at("model.layers.0.mlp.weight");
  EXPECT_EQ(weight.dtype, SafetensorsDType::kF32);
  EXPECT_EQ(weight.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(weight.elements(), 6u);
  EXPECT_EQ(weight.to_float(), matrix);
  const SafetensorsTensor& norm = file.at("norm.weight");
  EXPECT_EQ(norm.dtype, SafetensorsDType::kBF16);
  EXPECT_EQ(norm.bytes.size(), 8u);
  EXPECT_EQ(norm.to_float(), (std::vector<float>{0.5f, -1.0f, 3.0f, 1024.0f}));
  EXPECT_EQ(file.at("scale").shape.size(), 0u);
  EXPECT_EQ(file.at("scale").to_float(), scalar);
  EXPECT_EQ(file.at("empty").elements(), 0u);
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_THROW(file.at("missing"), InputError);

  // The same bytes as serialize_safetensors, the data section 8-byte aligned, and the same parse from memory.
  std::ifstream in(path, std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<std::byte> serialized = serialize_safetensors(tensors, metadata);
  EXPECT_EQ(as_bytes(raw), serialized);
  uint64_t header_length = 0;
  std::memcpy(&header_length, raw.data(), 8);
  EXPECT_EQ((8 + header_length) % 8, 0u);
  EXPECT_EQ(parse_safetensors(serialized, "memory").at("norm.weight").bytes, norm.bytes);
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"model.safetensors"}) << "no temporary file left";
}

TEST_F(SafetensorsTest, HandWrittenFileWithPaddingAndF16Parses) {
  // As another writer might produce it: keys in any order, spaces after the JSON, F16 data.
  const std::string header =
      R"({"h": {"shape": [5], "data_offsets": [0, 10], "dtype": "F16"}, "__metadata__": {"a": "b"}}   )";
  std::string contents(8, '\0');
  contents[0] = static_cast<char>(header.size());
  contents += header;
  // 1, −2, 0.5, the smallest subnormal 2^-24, +infinity.
  for (uint16_t half : {0x3c00, 0xc000, 0x3800, 0x0001, 0x7c00}) {
    contents.push_back(static_cast<char>(half & 0xff));
    contents.push_back(static_cast<char>(half >> 8));
  }
  const SafetensorsFile file = parse_safetensors(as_bytes(contents), "hand.safetensors");
  EXPECT_EQ(file.metadata.at("a"), "b");
  const std::vector<float> values = file.at("h").to_float();
  ASSERT_EQ(values.size(), 5u);
  EXPECT_EQ(values[0], 1.0f);
  EXPECT_EQ(values[1], -2.0f);
  EXPECT_EQ(values[2], 0.5f);
  EXPECT_EQ(values[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(values[4]));
}

TEST_F(SafetensorsTest, EmptyFileOfNoTensorsRoundTrips) {
  const fs::path path = dir_ / "none.safetensors";
  write_safetensors(path, {});
  const SafetensorsFile file = read_safetensors(path);
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_TRUE(file.metadata.empty());
}

TEST_F(SafetensorsTest, OtherDtypesCannotBeReadAsFloat) {
  const std::vector<int32_t> ints = {1, 2};
  const std::vector<TensorView> tensors = {{"ids", SafetensorsDType::kI32, {2}, std::as_bytes(std::span(ints))}};
  const SafetensorsFile file = parse_safetensors(serialize_safetensors(tensors), "ints");
  EXPECT_EQ(file.at("ids").dtype, SafetensorsDType::kI32);
  EXPECT_THROW(file.at("ids").to_float(), InputError);
}

TEST_F(SafetensorsTest, WriterRejectsInconsistentTensors) {
  const std::vector<float> three = {1, 2, 3};
  const fs::path path = dir_ / "bad.safetensors";
  const std::vector<std::vector<TensorView>> cases = {
      {{"a", SafetensorsDType::kF32, {2, 2}, tensor_bytes(three)}},                                       // wrong size
      {{"", SafetensorsDType::kF32, {3}, tensor_bytes(three)}},                                           // empty name
      {{"__metadata__", SafetensorsDType::kF32, {3}, tensor_bytes(three)}},                               // reserved
      {{"a", SafetensorsDType::kF32, {3}, tensor_bytes(three)}, {"a", SafetensorsDType::kF32, {0}, {}}},  // twice
      {{"a", SafetensorsDType::kF32, {-3}, tensor_bytes(three)}},                                         // negative
  };
  for (const auto& tensors : cases) {
    EXPECT_THROW(write_safetensors(path, tensors), InputError) << tensors.front().name;
  }
  EXPECT_TRUE(listing(dir_).empty());
}

TEST_F(SafetensorsTest, FailedWritesLeaveNoFile) {
  const std::vector<float> values = {1, 2, 3};
  const std::vector<TensorView> tensors = {{"a", SafetensorsDType::kF32, {3}, tensor_bytes(values)}};

  // A directory that does not exist: the temporary file cannot be created.
  EXPECT_THROW(write_safetensors(dir_ / "no" / "such" / "dir" / "x.safetensors", tensors), InputError);
  EXPECT_TRUE(listing(dir_).empty());

  // The target is a non-empty directory: the rename fails after the data is written, and the temporary goes.
  fs::create_directories(dir_ / "taken" / "inside");
  try {
    write_safetensors(dir_ / "taken", tensors);
    FAIL() << "expected an InputError";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("taken"), std::string::npos) << error.what();
  }
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"taken"});
  EXPECT_TRUE(fs::is_directory(dir_ / "taken" / "inside"));
}

TEST_F(SafetensorsTest, RewriteReplacesTheWholeFile) {
  const fs::path path = dir_ / "w.safetensors";
  const std::vector<float> big(1000, 1.0f), small = {2.0f};
  write_safetensors(path, std::vector<TensorView>{{"w", SafetensorsDType::kF32, {1000}, tensor_bytes(big)}});
  write_safetensors(path, std::vector<TensorView>{{"w", SafetensorsDType::kF32, {1}, tensor_bytes(small)}});
  EXPECT_EQ(read_safetensors(path).at("w").to_float(), small);
  EXPECT_LT(fs::file_size(path), 200u);
  EXPECT_EQ(listing(dir_), std::vector<std::string>{"w.safetensors"});
}

}  // namespace
}  // namespace emu::io
