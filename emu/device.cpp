#include "emu/device.h"

#include <new>
#include <utility>

namespace emu {

void Buffer::reset() {
  if (device_ == nullptr) return;
  if (data_ != nullptr) device_->raw_free(data_, bytes());
  device_->memory_.release(charge_);
  device_ = nullptr;
  data_ = nullptr;
  count_ = 0;
}

void Buffer::swap(Buffer& other) noexcept {
  std::swap(device_, other.device_);
  std::swap(data_, other.data_);
  std::swap(count_, other.count_);
  std::swap(dtype_, other.dtype_);
  std::swap(charge_, other.charge_);
}

Buffer Device::allocate(size_t count, DType dtype, Category category, std::string_view what) {
  return allocate(count, dtype, category, what, count * dtype_size(dtype));
}

Buffer Device::allocate(size_t count, DType dtype, Category category, std::string_view what, size_t charged_bytes) {
  const size_t size = count * dtype_size(dtype);
  Buffer buffer;
  buffer.charge_ = memory_.charge(charged_bytes, category, what);
  buffer.device_ = this;
  buffer.count_ = count;
  buffer.dtype_ = dtype;
  if (size != 0) {
    buffer.data_ = raw_allocate(size);
    if (buffer.data_ == nullptr && holds_data()) {
      buffer.device_ = nullptr;
      memory_.release(buffer.charge_);
      throw std::bad_alloc();
    }
  }
  return buffer;
}

}  // namespace emu
