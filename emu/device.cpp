#include "emu/device.h"

#include <new>
#include <utility>

namespace emu {

void Buffer::reset() {
  if (device_ == nullptr) return;
  if (data_ != nullptr) device_->raw_free(data_, bytes());
  device_->memory_.release(charged_, category_);
  device_ = nullptr;
  data_ = nullptr;
  count_ = 0;
}

void Buffer::swap(Buffer& other) noexcept {
  std::swap(device_, other.device_);
  std::swap(data_, other.data_);
  std::swap(count_, other.count_);
  std::swap(charged_, other.charged_);
  std::swap(dtype_, other.dtype_);
  std::swap(category_, other.category_);
}

Buffer Device::allocate(size_t count, DType dtype, Category category, std::string_view what) {
  return allocate(count, dtype, category, what, count * dtype_size(dtype));
}

Buffer Device::allocate(size_t count, DType dtype, Category category, std::string_view what, size_t charged_bytes) {
  const size_t size = count * dtype_size(dtype);
  memory_.charge(charged_bytes, category, what);
  Buffer buffer;
  buffer.device_ = this;
  buffer.count_ = count;
  buffer.charged_ = charged_bytes;
  buffer.dtype_ = dtype;
  buffer.category_ = category;
  if (size != 0) {
    buffer.data_ = raw_allocate(size);
    if (buffer.data_ == nullptr && holds_data()) {
      buffer.device_ = nullptr;
      memory_.release(charged_bytes, category);
      throw std::bad_alloc();
    }
  }
  return buffer;
}

}  // namespace emu
