// The CPU backend: buffers in host memory, 64-byte aligned for the vector units, zero-filled; its ops are the CPU
// kernels (cpu_ops.h).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "emu/cpu/cpu_ops.h"
#include "emu/device.h"

namespace emu {
namespace {

class CpuDevice final : public Device {
 public:
  using Device::Device;
  std::string_view backend() const override { return "cpu"; }
  bool holds_data() const override { return true; }
  Ops* ops() override { return &cpu::cpu_ops(); }

 protected:
  // calloc, not malloc and memset: glibc hands out fresh pages from the kernel (every large buffer the first time,
  // set-up's parameters and optimizer state) without writing them again, and clears only recycled memory. calloc
  // has no alignment argument: the buffer starts at the first 64-byte boundary past calloc's block, with the
  // block's address in the word before it, for raw_free.
  void* raw_allocate(size_t bytes) override {
    void* block = std::calloc(bytes + kAlignment, 1);
    if (block == nullptr) return nullptr;
    // 16 to 64 bytes past the block's start (malloc aligns to 16): room for the block's address.
    char* data = static_cast<char*>(block) + (kAlignment - reinterpret_cast<uintptr_t>(block) % kAlignment);
    std::memcpy(data - sizeof(void*), &block, sizeof(void*));
    return data;
  }
  void raw_free(void* data, size_t) override {
    void* block = nullptr;
    std::memcpy(&block, static_cast<char*>(data) - sizeof(void*), sizeof(void*));
    std::free(block);
  }

 private:
  static constexpr size_t kAlignment = 64;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(MemoryPool::Options options) { return std::make_unique<CpuDevice>(options); }

}  // namespace emu
