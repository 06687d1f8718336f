// The shapes-only backend: the same allocations, charged and released in the same order, holding no bytes.
#include "emu/device.h"

namespace emu {
namespace {

class ShapesDevice final : public Device {
 public:
  using Device::Device;
  std::string_view backend() const override { return "shapes"; }
  bool holds_data() const override { return false; }
  Ops* ops() override { return nullptr; }  // computes nothing

 protected:
  void* raw_allocate(size_t) override { return nullptr; }
  void raw_free(void*, size_t) override {}
};

}  // namespace

std::unique_ptr<Device> make_shapes_device(MemoryPool::Options options) {
  return std::make_unique<ShapesDevice>(options);
}

}  // namespace emu
