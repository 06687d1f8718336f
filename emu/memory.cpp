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

std::string_view allocator_name(AllocatorKind kind) { return kind == AllocatorKind::kCaching ? "caching" : "exact"; }

std::string OomEvent::message(uint64_t scale) const {
  // Full-scale bytes first, what the shrunk run charged in brackets.
  const auto bytes = [scale](uint64_t b) {
    return scale == 1 ? format_bytes(b) : fmt::format("{} [{}]", format_bytes(b * scale), format_bytes(b));
  };
  const uint64_t held = caching ? reserved : in_use;
  const uint64_t free_bytes = cap > held ? cap - held : 0;
  std::string text = fmt::format(
      "emu: out of memory on rank {}. Tried to allocate {} for {} ({}). Emulated GPU {} has a total capacity of {} "
      "of which {} is free. ",
      rank, bytes(requested), what.empty() ? "an unnamed tensor" : what, category_name(category), rank, bytes(cap),
      bytes(free_bytes));
  if (caching) {
    // As PyTorch's DeviceCachingAllocator::malloc words it; the reserve (CUDA context, NCCL) is not PyTorch's.
    const uint64_t reserve = breakdown[Category::kReserve];
    text += fmt::format(
        "Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated. If "
        "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
        "avoid fragmentation (emu: --alloc-conf expandable_segments:True). ",
        bytes(in_use - reserve), bytes(reserved > in_use ? reserved - in_use : 0));
  }
  text += fmt::format("{} is in use", bytes(in_use));
  text += fmt::format(" during {}", phase.empty() ? "an unnamed phase" : phase);
  if (!strategy.empty()) text += fmt::format(" under {}", strategy);
  text += ". In use by category:";
  for (size_t i = 0; i < kNumCategories; ++i) {
    if (breakdown.bytes[i] != 0) {
      text += fmt::format(" {} {};", category_name(category_at(i)), bytes(breakdown.bytes[i]));
    }
  }
  if (text.back() == ';') text.back() = '.';
  if (text.back() == ':') text += " nothing.";
  if (scale != 1) text += fmt::format(" (Bytes at full scale: the shrunk run's x {}; its own in brackets.)", scale);
  return text;
}

OutOfMemoryError::OutOfMemoryError(OomEvent event) : std::runtime_error(event.message()), event_(std::move(event)) {}

MemoryPool::MemoryPool(Options options) : options_(options), start_(std::chrono::steady_clock::now()) {
  if (options_.reserve > options_.cap) {
    throw InputError(fmt::format("the reserve for fixed overheads ({}) is larger than the cap ({})",
                                 format_bytes(options_.reserve), format_bytes(options_.cap)));
  }
  EMU_CHECK(options_.scale >= 1, "the allocator's scale must be at least 1, not {}", options_.scale);
  if (options_.allocator == AllocatorKind::kCaching) {
    // The allocator's segments may fill the cap less the reserve, at full scale: reserved / scale <= that room.
    const uint64_t room = options_.cap - options_.reserve;
    const bool unlimited = options_.cap == kNoCap || room > kNoCap / options_.scale;
    allocator_.emplace(options_.alloc_conf, unlimited ? kNoCap : room * options_.scale);
  }
  // The reserve is the driver's and NCCL's, not the allocator's: it is held outside it.
  if (options_.reserve > 0) count(options_.reserve, Category::kReserve);
}

MemoryPool::Charge MemoryPool::charge(uint64_t bytes, Category category, std::string_view what) {
  Charge charge{bytes, category, CachingAllocator::kNoBlock};
  if (allocator_) {
    // PyTorch hands a 0-byte tensor no block; the rest goes through the allocator at full scale.
    if (bytes != 0) {
      const uint64_t full = bytes > kNoCap / options_.scale ? kNoCap : bytes * options_.scale;
      if (const auto served = allocator_->allocate(full)) {
        charge.block = *served;
      } else {
        out_of_memory(bytes, category, what);  // throws in strict mode
        charge.block = allocator_->allocate_past_limit(full);
      }
    }
  } else if (bytes > options_.cap || in_use_ > options_.cap - bytes) {
    out_of_memory(bytes, category, what);
  }
  count(bytes, category);
  return charge;
}

void MemoryPool::out_of_memory(uint64_t bytes, Category category, std::string_view what) {
  OomEvent event{.rank = options_.rank,
                 .requested = bytes,
                 .in_use = in_use_,
                 .reserved = reserved(),
                 .caching = allocator_.has_value(),
                 .cap = options_.cap,
                 .breakdown = current_,
                 .category = category,
                 .what = std::string(what),
                 .phase = phase_,
                 .strategy = strategy_,
                 .seconds = seconds_since_start()};
  if (options_.mode == OomMode::kStrict) throw OutOfMemoryError(std::move(event));
  if (!first_oom_) first_oom_ = std::move(event);
}

void MemoryPool::count(uint64_t bytes, Category category) {
  in_use_ += bytes;
  current_[category] += bytes;
  if (current_[category] > category_peak_[category]) category_peak_[category] = current_[category];
  if (in_use_ > peak_) {
    peak_ = in_use_;
    at_peak_ = current_;
  }
  const uint64_t held = reserved();
  if (held > reserved_peak_ || (held == reserved_peak_ && in_use_ > allocated_at_reserved_peak_)) {
    reserved_peak_ = held;
    allocated_at_reserved_peak_ = in_use_;
  }
  record(category, static_cast<int64_t>(bytes));
}

void MemoryPool::release(const Charge& charge) {
  EMU_CHECK(current_[charge.category] >= charge.bytes, "releasing {} bytes of {} but only {} are charged", charge.bytes,
            category_name(charge.category), current_[charge.category]);
  if (charge.block != CachingAllocator::kNoBlock) allocator_->free(charge.block);
  in_use_ -= charge.bytes;
  current_[charge.category] -= charge.bytes;
  record(charge.category, -static_cast<int64_t>(charge.bytes));
}

uint64_t MemoryPool::reserved() const {
  return allocator_ ? options_.reserve + allocator_->reserved() / options_.scale : in_use_;
}

void MemoryPool::reset_peaks() {
  peak_ = in_use_;
  category_peak_ = current_;
  at_peak_ = current_;
  reserved_peak_ = reserved();
  allocated_at_reserved_peak_ = in_use_;
}

double MemoryPool::seconds_since_start() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void MemoryPool::record(Category category, int64_t delta) {
  if (!options_.timeline || delta == 0) return;
  timeline_.push_back(TimelinePoint{seconds_since_start(), category, delta, in_use_, reserved()});
}

}  // namespace emu
