// The CPU backend: buffers in host memory, 64-byte aligned for the vector units, zero-filled; its ops are the CPU
// kernels (cpu_ops.h).
#include <cstdint>
#include <cstdlib>

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
    const uintptr_t data = (reinterpret_cast<uintptr_t>(block) + kAlignment) & ~uintptr_t{kAlignment - 1};
    reinterpret_cast<void**>(data)[-1] = block;  // at least 16 bytes past block: malloc aligns to 16
    return reinterpret_cast<void*>(data);
  }
  void raw_free(void* data, size_t) override { std::free(static_cast<void**>(data)[-1]); }

 private:
  static constexpr size_t kAlignment = 64;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(MemoryPool::Options options) { return std::make_unique<CpuDevice>(options); }

}  // namespace emu
