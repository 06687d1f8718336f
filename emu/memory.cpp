#include "emu/memory.h"

#include <fmt/format.h>

#include "emu/check.h"
#include "emu/units.h"

namespace emu {

std::string_view category_name(Category category) {
  switch (category) {
    case Category::kReserve: return "reserve";
    case Category::kParameters: return "parameters";
    case Category::kGradients: return "gradients";
    case Category::kMasterWeights: return "master_weights";
    case Category::kOptimizerState: return "optimizer_state";
    case Category::kActivations: return "activations";
    case Category::kTemporaries: return "temporaries";
    case Category::kCommBuffers: return "comm_buffers";
    case Category::kBuckets: return "buckets";
  }
  return "unknown";
}

uint64_t CategoryBytes::total() const {
  uint64_t sum = 0;
  for (uint64_t b : bytes) sum += b;
  return sum;
}

std::string OomEvent::message() const {
  const uint64_t free_bytes = cap > in_use ? cap - in_use : 0;
  std::string text = fmt::format(
      "emu: out of memory on rank {}. Tried to allocate {} for {} ({}). Emulated GPU {} has a total capacity of {} "
      "of which {} is free. {} is in use",
      rank, format_bytes(requested), what.empty() ? "an unnamed tensor" : what, category_name(category), rank,
      format_bytes(cap), format_bytes(free_bytes), format_bytes(in_use));
  text += fmt::format(" during {}", phase.empty() ? "an unnamed phase" : phase);
  if (!strategy.empty()) text += fmt::format(" under {}", strategy);
  text += ". In use by category:";
  for (size_t i = 0; i < kNumCategories; ++i) {
    if (breakdown.bytes[i] != 0) {
      text += fmt::format(" {} {};", category_name(category_at(i)), format_bytes(breakdown.bytes[i]));
    }
  }
  if (text.back() == ';') text.back() = '.';
  if (text.back() == ':') text += " nothing.";
  return text;
}

OutOfMemoryError::OutOfMemoryError(OomEvent event) : std::runtime_error(event.message()), event_(std::move(event)) {}

MemoryPool::MemoryPool(Options options) : options_(options), start_(std::chrono::steady_clock::now()) {
  if (options_.reserve > options_.cap) {
    throw InputError(fmt::format("the reserve for fixed overheads ({}) is larger than the cap ({})",
                                 format_bytes(options_.reserve), format_bytes(options_.cap)));
  }
  if (options_.reserve > 0) charge(options_.reserve, Category::kReserve, "CUDA context and NCCL buffers");
}

void MemoryPool::charge(uint64_t bytes, Category category, std::string_view what) {
  const bool passes_cap = bytes > options_.cap || in_use_ > options_.cap - bytes;
  if (passes_cap) {
    OomEvent event{options_.rank,     bytes,  in_use_,   options_.cap,         current_, category,
                   std::string(what), phase_, strategy_, seconds_since_start()};
    if (options_.mode == OomMode::kStrict) throw OutOfMemoryError(std::move(event));
    if (!first_oom_) first_oom_ = std::move(event);
  }
  in_use_ += bytes;
  current_[category] += bytes;
  if (current_[category] > category_peak_[category]) category_peak_[category] = current_[category];
  if (in_use_ > peak_) {
    peak_ = in_use_;
    at_peak_ = current_;
  }
  record(category, static_cast<int64_t>(bytes));
}

void MemoryPool::release(uint64_t bytes, Category category) {
  EMU_CHECK(current_[category] >= bytes, "releasing {} bytes of {} but only {} are charged", bytes,
            category_name(category), current_[category]);
  in_use_ -= bytes;
  current_[category] -= bytes;
  record(category, -static_cast<int64_t>(bytes));
}

void MemoryPool::reset_peaks() {
  peak_ = in_use_;
  category_peak_ = current_;
  at_peak_ = current_;
}

double MemoryPool::seconds_since_start() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void MemoryPool::record(Category category, int64_t delta) {
  if (!options_.timeline || delta == 0) return;
  timeline_.push_back(TimelinePoint{seconds_since_start(), category, delta, in_use_});
}

}  // namespace emu
