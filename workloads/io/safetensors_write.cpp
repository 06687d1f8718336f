// Writing safetensors, and the dtype table both directions share.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "emu/check.h"
#include "workloads/io/safetensors.h"

namespace emu::io {
namespace {

struct DTypeInfo {
  SafetensorsDType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 15> kDTypes = {{
    {SafetensorsDType::kBool, "BOOL", 1},
    {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},
    {SafetensorsDType::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDType::kF8E4M3, "F8_E4M3", 1},
    {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU16, "U16", 2},
    {SafetensorsDType::kF16, "F16", 2},
    {SafetensorsDType::kBF16, "BF16", 2},
    {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU32, "U32", 4},
    {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kF64, "F64", 8},
    {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kU64, "U64", 8},
}};

// info() indexes the table by the enum's value.
constexpr bool in_enum_order() {
  for (size_t i = 0; i < kDTypes.size(); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(in_enum_order());

const DTypeInfo& info(SafetensorsDType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

[[noreturn]] void fail(std::string_view target, std::string_view problem) {
  throw InputError(fmt::format("safetensors file {}: {}", target, problem));
}

// The header JSON, padded with spaces so that the data section starts 8-byte aligned (8 + length ≡ 0 mod 8).
std::string build_header(std::span<const TensorView> tensors,
                         const std::map<std::string, std::string, std::less<>>& metadata, std::string_view target) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const TensorView& tensor : tensors) {
    if (tensor.name.empty() || tensor.name == "__metadata__") {
      fail(target, fmt::format("tensor name \"{}\" is empty or reserved", tensor.name));
    }
    if (!names.insert(tensor.name).second) fail(target, fmt::format("tensor \"{}\" is given twice", tensor.name));
    uint64_t elements = 1;
    for (int64_t dim : tensor.shape) {
      if (dim < 0) fail(target, fmt::format("tensor \"{}\" has a negative dimension {}", tensor.name, dim));
      elements *= static_cast<uint64_t>(dim);
    }
    const uint64_t bytes = elements * info(tensor.dtype).size;
    if (bytes != tensor.bytes.size()) {
      fail(target, fmt::format("tensor \"{}\" of {} elements of {} needs {} bytes, got {}", tensor.name, elements,
                               info(tensor.dtype).name, bytes, tensor.bytes.size()));
    }
    header[tensor.name] = {
        {"dtype", info(tensor.dtype).name}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

std::array<std::byte, 8> length_prefix(uint64_t length) {
  std::array<std::byte, 8> prefix{};
  for (size_t i = 0; i < 8; ++i) prefix[i] = static_cast<std::byte>(length >> (8 * i) & 0xffu);
  return prefix;
}

// Removes the temporary file unless the write completed and renamed it.
class TemporaryFile {
 public:
  TemporaryFile(std::string path, std::string_view target) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(target, fmt::format("cannot create {}: {}", path_, std::strerror(errno)));
  }
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

  void write(std::span<const std::byte> bytes, std::string_view target) {
    while (!bytes.empty()) {
      const ssize_t written = ::write(fd_, bytes.data(), bytes.size());
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) fail(target, fmt::format("write to {} failed: {}", path_, std::strerror(errno)));
      bytes = bytes.subspan(static_cast<size_t>(written));
    }
  }

  // Flushes to disk, closes, and renames over `target`: after this the file is complete at `target`.
  void commit(const std::string& target) {
    if (::fsync(fd_) != 0) fail(target, fmt::format("fsync of {} failed: {}", path_, std::strerror(errno)));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(target, fmt::format("close of {} failed: {}", path_, std::strerror(errno)));
    if (::rename(path_.c_str(), target.c_str()) != 0) {
      fail(target, fmt::format("cannot rename {} to it: {}", path_, std::strerror(errno)));
    }
    committed_ = true;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool committed_ = false;
};

std::span<const std::byte> as_bytes(std::string_view text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

}  // namespace

std::string_view safetensors_dtype_name(SafetensorsDType dtype) { return info(dtype).name; }
size_t safetensors_dtype_size(SafetensorsDType dtype) { return info(dtype).size; }

std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view name) {
  for (const DTypeInfo& entry : kDTypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

std::span<const std::byte> tensor_bytes(std::span<const float> values) {
  static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");
  return std::as_bytes(values);
}

std::span<const std::byte> tensor_bytes(std::span<const uint16_t> values) { return std::as_bytes(values); }

std::vector<std::byte> serialize_safetensors(std::span<const TensorView> tensors,
                                             const std::map<std::string, std::string, std::less<>>& metadata) {
  const std::string header = build_header(tensors, metadata, "(in memory)");
  size_t total = 8 + header.size();
  for (const TensorView& tensor : tensors) total += tensor.bytes.size();
  std::vector<std::byte> contents(total);
  std::byte* out = contents.data();
  auto append = [&out](std::span<const std::byte> bytes) {
    if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
    out += bytes.size();
  };
  append(length_prefix(header.size()));
  append(as_bytes(header));
  for (const TensorView& tensor : tensors) append(tensor.bytes);
  return contents;
}

void write_safetensors(const std::filesystem::path& path, std::span<const TensorView> tensors,
                       const std::map<std::string, std::string, std::less<>>& metadata) {
  const std::string target = path.string();
  const std::string header = build_header(tensors, metadata, target);
  TemporaryFile file(fmt::format("{}.tmp.{}", target, ::getpid()), target);
  file.write(length_prefix(header.size()), target);
  file.write(as_bytes(header), target);
  for (const TensorView& tensor : tensors) file.write(tensor.bytes, target);
  file.commit(target);
}

}  // namespace emu::io
