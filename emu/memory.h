// The emulated GPU's memory: a per-rank byte budget with a hard cap, counted by category.
//
// Every tensor a GPU would hold is charged here at its logical size (bf16 = 2 bytes) before it exists: that is
// the *allocated* memory, counted by category. The cap includes a reserve for the fixed overheads a real GPU has
// (CUDA context, NCCL's own buffers). With the caching allocator (the default of runs), each allocation also goes
// through a model of PyTorch's CUDA caching allocator (caching_allocator.h) at full scale, and what the device
// holds is the *reserved* memory: the reserve plus the allocator's segments. An allocation that would take the
// reserved memory past the cap (allocated memory, with the exact allocator) is an out-of-memory: in strict mode it
// throws OutOfMemoryError at once, as a GPU would; in record mode (the default for runs) the first one is recorded and
// the step continues over the cap on the host, so no peer is left waiting inside a collective, and the ranks agree on
// the verdict at the step's end.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "emu/caching_allocator.h"

namespace emu {

enum class Category : uint8_t {
  kReserve,         // fixed overheads: CUDA context, NCCL buffers
  kParameters,      // model weights at compute precision
  kGradients,       // gradients at compute precision
  kMasterWeights,   // fp32 master copy of the weights (mixed precision)
  kOptimizerState,  // Adam moments
  kActivations,     // tensors saved in forward for backward
  kTemporaries,     // short-lived work buffers
  kCommBuffers,     // buffers a collective algorithm needs
  kBuckets,         // gradient / reduce / all-gather bucket buffers
};
inline constexpr size_t kNumCategories = 9;
inline constexpr uint64_t kNoCap = std::numeric_limits<uint64_t>::max();

std::string_view category_name(Category category);
inline constexpr Category category_at(size_t index) { return static_cast<Category>(index); }

// Bytes per category.
struct CategoryBytes {
  std::array<uint64_t, kNumCategories> bytes{};
  uint64_t& operator[](Category c) { return bytes[static_cast<size_t>(c)]; }
  uint64_t operator[](Category c) const { return bytes[static_cast<size_t>(c)]; }
  uint64_t total() const;
};

enum class OomMode : uint8_t {
  kStrict,  // throw OutOfMemoryError at the allocation, as a GPU would
  kRecord,  // record the first OOM, keep going over the cap, report at the step's end
};

enum class AllocatorKind : uint8_t {
  kExact,    // the device holds exactly the bytes allocated
  kCaching,  // PyTorch's CUDA caching allocator: the device holds the segments it reserved
};
std::string_view allocator_name(AllocatorKind kind);

// Everything known at the moment an allocation would have passed the cap.
struct OomEvent {
  int rank = 0;
  uint64_t requested = 0;  // bytes of the allocation that did not fit
  uint64_t in_use = 0;     // bytes in use before it, reserve included
  uint64_t reserved = 0;   // bytes the device held when it failed, reserve included (caching: after freeing its cache)
  bool caching = false;    // the caching allocator ran out, not the exact count
  uint64_t cap = 0;
  CategoryBytes breakdown;  // in use by category, before it
  Category category = Category::kTemporaries;
  std::string what;      // the tensor, e.g. "block 17 attention scores"
  std::string phase;     // e.g. "forward, block 17"
  std::string strategy;  // e.g. "zero2"
  double seconds = 0;    // since the pool was made, on the timeline's clock
  // Reads like PyTorch's CUDA OOM message, with the breakdown and the phase added. `scale` k² of a shrunk run:
  // every figure at full scale (bytes × scale), the shrunk run's own bytes in brackets.
  std::string message(uint64_t scale = 1) const;
};

class OutOfMemoryError : public std::runtime_error {
 public:
  explicit OutOfMemoryError(OomEvent event);
  const OomEvent& event() const { return event_; }

 private:
  OomEvent event_;
};

// One change of in-use bytes, for memory-over-time pictures and trace counters.
struct TimelinePoint {
  double seconds = 0;  // since the pool was made
  Category category = Category::kTemporaries;
  int64_t delta = 0;
  uint64_t in_use = 0;    // total after the change
  uint64_t reserved = 0;  // held by the device after the change (= in_use with the exact allocator)
};

class MemoryPool {
 public:
  struct Options {
    uint64_t cap = kNoCap;  // bytes, reserve included
    uint64_t reserve = 0;   // fixed overheads, charged at construction
    OomMode mode = OomMode::kStrict;
    int rank = 0;
    bool timeline = true;
    AllocatorKind allocator = AllocatorKind::kExact;  // runs default to kCaching (--allocator)
    AllocatorConfig alloc_conf;                       // --alloc-conf, for kCaching
    // k² in a shrunk run: the caching allocator sees every request × scale (full-scale sizes, so rounding and
    // segments act as on the real GPU) and its reserved bytes ÷ scale count against the cap.
    uint64_t scale = 1;
  };

  // One allocation, as charge() made it: what release() gives back.
  struct Charge {
    uint64_t bytes = 0;
    Category category = Category::kTemporaries;
    CachingAllocator::BlockId block = CachingAllocator::kNoBlock;
  };

  explicit MemoryPool(Options options);
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // Charges `bytes` to `category`. Throws OutOfMemoryError in strict mode if it would pass the cap.
  [[nodiscard]] Charge charge(uint64_t bytes, Category category, std::string_view what = {});
  void release(const Charge& charge);

  uint64_t cap() const { return options_.cap; }
  uint64_t reserve() const { return options_.reserve; }
  OomMode mode() const { return options_.mode; }
  int rank() const { return options_.rank; }
  uint64_t in_use() const { return in_use_; }
  uint64_t in_use(Category category) const { return current_[category]; }
  const CategoryBytes& current() const { return current_; }
  uint64_t peak() const { return peak_; }
  uint64_t peak(Category category) const { return category_peak_[category]; }
  const CategoryBytes& category_peaks() const { return category_peak_; }
  // In use by category at the moment the total peaked.
  const CategoryBytes& breakdown_at_peak() const { return at_peak_; }
  // Held by the device: the reserve plus the caching allocator's segments ÷ scale (= in_use() when exact).
  uint64_t reserved() const;
  uint64_t reserved_peak() const { return reserved_peak_; }
  // Allocated at the reserved peak (the most while reserved stood there): the peak's fragmentation is
  // reserved_peak() - allocated_at_reserved_peak().
  uint64_t allocated_at_reserved_peak() const { return allocated_at_reserved_peak_; }
  AllocatorKind allocator_kind() const { return options_.allocator; }
  // The caching allocator's state, at full scale; null when exact.
  const CachingAllocator* caching_allocator() const { return allocator_ ? &*allocator_ : nullptr; }
  // Peaks start again from what is in use now (e.g. at the start of a measured step).
  void reset_peaks();

  // The first allocation that passed the cap, in record mode; empty if none did.
  const std::optional<OomEvent>& first_oom() const { return first_oom_; }

  void set_phase(std::string phase) { phase_ = std::move(phase); }
  const std::string& phase() const { return phase_; }
  void set_strategy(std::string strategy) { strategy_ = std::move(strategy); }
  const std::string& strategy() const { return strategy_; }

  const std::vector<TimelinePoint>& timeline() const { return timeline_; }

 private:
  void record(Category category, int64_t delta);
  double seconds_since_start() const;
  void out_of_memory(uint64_t bytes, Category category, std::string_view what);
  void count(uint64_t bytes, Category category);

  Options options_;
  std::optional<CachingAllocator> allocator_;
  uint64_t in_use_ = 0;
  uint64_t peak_ = 0;
  uint64_t reserved_peak_ = 0;
  uint64_t allocated_at_reserved_peak_ = 0;
  CategoryBytes current_;
  CategoryBytes category_peak_;
  CategoryBytes at_peak_;
  std::optional<OomEvent> first_oom_;
  std::string phase_;
  std::string strategy_;
  std::vector<TimelinePoint> timeline_;
  std::chrono::steady_clock::time_point start_;
};

// Names the phase for as long as it lives, then restores the previous one:
//   PhaseScope phase(pool, fmt::format("forward, block {}", i));
class PhaseScope {
 public:
  PhaseScope(MemoryPool& pool, std::string phase) : pool_(pool), previous_(pool.phase()) {
    pool_.set_phase(std::move(phase));
  }
  ~PhaseScope() { pool_.set_phase(std::move(previous_)); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  MemoryPool& pool_;
  std::string previous_;
};

}  // namespace emu
