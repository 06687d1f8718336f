// The CPU backend: buffers in host memory, 64-byte aligned for the vector units, zero-filled; its ops are the CPU
// kernels (cpu_ops.h).
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
  void* raw_allocate(size_t bytes) override {
    constexpr size_t kAlignment = 64;
    void* data = std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    if (data != nullptr) std::memset(data, 0, bytes);
    return data;
  }
  void raw_free(void* data, size_t) override { std::free(data); }
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(MemoryPool::Options options) { return std::make_unique<CpuDevice>(options); }

}  // namespace emu
