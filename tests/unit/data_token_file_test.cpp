// Token files: uint16 and uint32 little-endian tokens read back exactly, samples are windows of the file, and
// every kind of bad file is an InputError that names the file (and, for a bad token, its offset and value).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "emu/check.h"
#include "workloads/data/token_file.h"

namespace emu::data {
namespace {

namespace fs = std::filesystem;

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("emu_token_file_test." + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `values` as little-endian integers of `width` bytes.
  fs::path write(const std::string& name, const std::vector<uint32_t>& values, size_t width) {
    std::string bytes;
    for (uint32_t value : values) {
      for (size_t i = 0; i < width; ++i) bytes.push_back(static_cast<char>(value >> (8 * i) & 0xffu));
    }
    return write_raw(name, bytes);
  }
  fs::path write_raw(const std::string& name, const std::string& bytes) {
    fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  // The InputError message for `config`, or a failure if there is none.
  static std::string error_of(const TokenFileConfig& config) {
    try {
      TokenFile file(config);
    } catch (const InputError& error) {
      return error.what();
    }
    ADD_FAILURE() << "expected an InputError for " << config.path;
    return {};
  }

  fs::path dir_;
};

TEST_F(TokenFileTest, ReadsUint16AndUint32Tokens) {
  const std::vector<uint32_t> values = {0, 1, 255, 256, 999, 7};
  const std::vector<int32_t> expected(values.begin(), values.end());
  EXPECT_EQ(read_token_file(write("a.u16", values, 2), TokenWidth::kU16, 1000), expected);
  EXPECT_EQ(read_token_file(write("a.u32", values, 4), TokenWidth::kU32, 1000), expected);
  const std::vector<uint32_t> wide = {70000, 3};
  EXPECT_EQ(read_token_file(write("b.u32", wide, 4), TokenWidth::kU32, 70001), (std::vector<int32_t>{70000, 3}));
}

TEST_F(TokenFileTest, IdsFoldIntoASmallerVocabulary) {
  const std::vector<uint32_t> values = {0, 7, 12, 13, 26, 99, 5};
  TokenFileConfig config{write("fold.u16", values, 2), TokenWidth::kU16, 100, 3, 9};
  config.fold_vocab = 13;  // a shrunk model's vocabulary
  const TokenFile file(config);
  EXPECT_EQ(file.vocab(), 13);
  EXPECT_EQ(std::vector<int32_t>(file.tokens().begin(), file.tokens().end()),
            (std::vector<int32_t>{0, 7, 12, 0, 0, 8, 5}));
  config.fold_vocab = 100;  // not smaller: nothing to fold
  EXPECT_EQ(TokenFile(config).vocab(), 100);
  config.fold_vocab = 13;
  config.vocab = 50;  // 99 is still checked against the file's own vocabulary, before folding
  EXPECT_THROW(TokenFile{config}, InputError);
}

TEST_F(TokenFileTest, SamplesAreDeterministicWindowsOfTheFile) {
  std::vector<uint32_t> values(200);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint32_t>(i % 100);
  TokenFileConfig config{write("seq.u16", values, 2), TokenWidth::kU16, 100, 16, 9};
  const TokenFile file(config), again(config);
  EXPECT_EQ(file.token_count(), 200u);
  const Batch batch = file.batch(5, 0, 8);
  EXPECT_EQ(batch.tokens, again.batch(5, 0, 8).tokens);
  EXPECT_NE(batch.tokens, file.batch(6, 0, 8).tokens);
  for (int64_t row = 0; row < 8; ++row) {
    for (int64_t j = 0; j < 16; ++j) {
      const auto i = static_cast<size_t>(row * 16 + j);
      EXPECT_EQ(batch.targets[i], (batch.tokens[i] + 1) % 100) << "consecutive tokens of the file";
      if (j > 0) {
        EXPECT_EQ(batch.tokens[i], batch.targets[i - 1]);
      }
    }
  }
  // Rank slices equal the single-rank batch.
  const Batch part = file.batch(5, sample_offset(3, 4, 0, 2), 2);
  EXPECT_TRUE(std::equal(part.tokens.begin(), part.tokens.end(), batch.tokens.begin() + 6 * 16));
}

TEST_F(TokenFileTest, ExactlyOneSequenceIsEnough) {
  const TokenFile file({write("short.u16", {1, 2, 3, 4, 5}, 2), TokenWidth::kU16, 10, 4, 1});
  const Batch batch = file.batch(0, 0, 2);
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{1, 2, 3, 4, 1, 2, 3, 4}));
  EXPECT_EQ(batch.targets, (std::vector<int32_t>{2, 3, 4, 5, 2, 3, 4, 5}));
}

TEST_F(TokenFileTest, TokenOutOfVocabularyNamesFileOffsetAndValue) {
  const fs::path path = write("bad.u16", {1, 2, 3, 500, 4}, 2);
  const std::string message = error_of({path, TokenWidth::kU16, 100, 2, 1});
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("byte offset 6"), std::string::npos) << message;
  EXPECT_NE(message.find("500"), std::string::npos) << message;
  EXPECT_NE(message.find("100"), std::string::npos) << message;
}

TEST_F(TokenFileTest, MalformedFilesAreBadInput) {
  const std::string odd = error_of({write_raw("odd.u16", std::string(7, '\0')), TokenWidth::kU16, 10, 2, 1});
  EXPECT_NE(odd.find("odd.u16"), std::string::npos) << odd;
  EXPECT_NE(odd.find("whole number"), std::string::npos) << odd;
  const std::string u32 = error_of({write_raw("six.u32", std::string(6, '\0')), TokenWidth::kU32, 10, 1, 1});
  EXPECT_NE(u32.find("whole number"), std::string::npos) << u32;

  const std::string short_file = error_of({write("short.u16", {1, 2, 3}, 2), TokenWidth::kU16, 10, 3, 1});
  EXPECT_NE(short_file.find("too short"), std::string::npos) << short_file;
  EXPECT_NE(short_file.find("needs 4 tokens"), std::string::npos) << short_file;

  const std::string empty = error_of({write_raw("empty.u16", ""), TokenWidth::kU16, 10, 1, 1});
  EXPECT_NE(empty.find("too short"), std::string::npos) << empty;

  const std::string missing = error_of({dir_ / "missing.u16", TokenWidth::kU16, 10, 1, 1});
  EXPECT_NE(missing.find("missing.u16"), std::string::npos) << missing;
  const std::string directory = error_of({dir_, TokenWidth::kU16, 10, 1, 1});
  EXPECT_NE(directory.find("not a regular file"), std::string::npos) << directory;

  const fs::path good = write("good.u16", {1, 2, 3}, 2);
  EXPECT_FALSE(error_of({good, TokenWidth::kU16, 0, 1, 1}).empty()) << "vocabulary 0";
  EXPECT_FALSE(error_of({good, TokenWidth::kU16, 10, 0, 1}).empty()) << "sequence length 0";
}

}  // namespace
}  // namespace emu::data
