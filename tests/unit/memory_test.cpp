// The emulated device's memory: the cap to the byte, peaks and categories, the OOM error's contents, record mode.
#include <gtest/gtest.h>

#include "emu/check.h"
#include "emu/device.h"
#include "emu/memory.h"

namespace emu {
namespace {

MemoryPool::Options capped(uint64_t cap, OomMode mode = OomMode::kStrict, uint64_t reserve = 0) {
  MemoryPool::Options options;
  options.cap = cap;
  options.reserve = reserve;
  options.mode = mode;
  options.rank = 5;
  return options;
}

TEST(MemoryPool, CapIsEnforcedToTheByte) {
  MemoryPool pool(capped(1000));
  (void)pool.charge(600, Category::kParameters);
  const auto gradients = pool.charge(400, Category::kGradients);  // exactly at the cap: fits
  EXPECT_EQ(pool.in_use(), 1000u);
  EXPECT_THROW((void)pool.charge(1, Category::kTemporaries), OutOfMemoryError);
  EXPECT_EQ(pool.in_use(), 1000u) << "a failed allocation charges nothing";
  pool.release(gradients);
  EXPECT_NO_THROW((void)pool.charge(1, Category::kTemporaries));
}

TEST(MemoryPool, HugeRequestDoesNotOverflow) {
  MemoryPool pool(capped(1000));
  (void)pool.charge(10, Category::kParameters);
  EXPECT_THROW((void)pool.charge(~0ull - 5, Category::kParameters), OutOfMemoryError);
}

TEST(MemoryPool, PeaksPerCategoryAndOverall) {
  MemoryPool pool(capped(kNoCap));
  (void)pool.charge(100, Category::kParameters);
  const auto first = pool.charge(50, Category::kActivations);
  const auto second = pool.charge(30, Category::kActivations);
  pool.release(first);
  pool.release(second);
  (void)pool.charge(60, Category::kGradients);
  EXPECT_EQ(pool.in_use(), 160u);
  EXPECT_EQ(pool.peak(), 180u);
  EXPECT_EQ(pool.peak(Category::kActivations), 80u);
  EXPECT_EQ(pool.peak(Category::kGradients), 60u);
  EXPECT_EQ(pool.in_use(Category::kActivations), 0u);
  EXPECT_EQ(pool.breakdown_at_peak()[Category::kActivations], 80u);
  EXPECT_EQ(pool.breakdown_at_peak()[Category::kGradients], 0u);
  pool.reset_peaks();
  EXPECT_EQ(pool.peak(), 160u);
  EXPECT_EQ(pool.peak(Category::kActivations), 0u);
}

TEST(MemoryPool, ReserveCountsInsideTheCap) {
  MemoryPool pool(capped(1000, OomMode::kStrict, 300));
  EXPECT_EQ(pool.in_use(Category::kReserve), 300u);
  EXPECT_NO_THROW((void)pool.charge(700, Category::kParameters));
  EXPECT_THROW((void)pool.charge(1, Category::kParameters), OutOfMemoryError);
}

TEST(MemoryPool, ReserveLargerThanCapIsBadInput) {
  EXPECT_THROW(MemoryPool(capped(100, OomMode::kStrict, 101)), InputError);
}

TEST(MemoryPool, OomErrorCarriesEverything) {
  MemoryPool pool(capped(3 * 1024 * 1024));
  pool.set_strategy("zero3");
  (void)pool.charge(2 * 1024 * 1024, Category::kParameters);
  (void)pool.charge(512 * 1024, Category::kActivations);
  PhaseScope phase(pool, "forward, block 17");
  try {
    (void)pool.charge(1024 * 1024, Category::kTemporaries, "block 17 attention scores");
    FAIL() << "expected an out-of-memory error";
  } catch (const OutOfMemoryError& error) {
    const OomEvent& event = error.event();
    EXPECT_EQ(event.rank, 5);
    EXPECT_EQ(event.requested, 1024u * 1024);
    EXPECT_EQ(event.in_use, 2560u * 1024);
    EXPECT_EQ(event.cap, 3u * 1024 * 1024);
    EXPECT_EQ(event.breakdown[Category::kParameters], 2u * 1024 * 1024);
    EXPECT_EQ(event.breakdown[Category::kActivations], 512u * 1024);
    EXPECT_EQ(event.phase, "forward, block 17");
    EXPECT_EQ(event.strategy, "zero3");
    const std::string message = error.what();
    EXPECT_NE(message.find("out of memory on rank 5"), std::string::npos) << message;
    EXPECT_NE(message.find("Tried to allocate 1.00 MiB"), std::string::npos) << message;
    EXPECT_NE(message.find("total capacity of 3.00 MiB of which 512.00 KiB is free"), std::string::npos) << message;
    EXPECT_NE(message.find("forward, block 17"), std::string::npos) << message;
    EXPECT_NE(message.find("under zero3"), std::string::npos) << message;
    EXPECT_NE(message.find("parameters 2.00 MiB; activations 512.00 KiB."), std::string::npos) << message;
    EXPECT_NE(message.find("block 17 attention scores (temporaries)"), std::string::npos) << message;
  }
}

TEST(MemoryPool, PhaseScopeRestoresThePreviousPhase) {
  MemoryPool pool(capped(kNoCap));
  pool.set_phase("step 3");
  {
    PhaseScope inner(pool, "backward, block 2");
    EXPECT_EQ(pool.phase(), "backward, block 2");
  }
  EXPECT_EQ(pool.phase(), "step 3");
}

TEST(MemoryPool, RecordModeKeepsGoingAndKeepsTheFirstOom) {
  MemoryPool pool(capped(100, OomMode::kRecord));
  pool.set_phase("optimizer step");
  (void)pool.charge(90, Category::kMasterWeights);
  EXPECT_NO_THROW((void)pool.charge(20, Category::kOptimizerState, "adam m"));
  pool.set_phase("later");
  EXPECT_NO_THROW((void)pool.charge(50, Category::kOptimizerState, "adam v"));
  ASSERT_TRUE(pool.first_oom().has_value());
  EXPECT_EQ(pool.first_oom()->requested, 20u);
  EXPECT_EQ(pool.first_oom()->in_use, 90u);
  EXPECT_EQ(pool.first_oom()->phase, "optimizer step");
  EXPECT_EQ(pool.peak(), 160u) << "the peak says what the step would have needed";
}

TEST(MemoryPool, TimelineFollowsEveryChange) {
  MemoryPool pool(capped(kNoCap));
  (void)pool.charge(10, Category::kParameters);
  pool.release(pool.charge(5, Category::kActivations));
  ASSERT_EQ(pool.timeline().size(), 3u);
  EXPECT_EQ(pool.timeline()[1].in_use, 15u);
  EXPECT_EQ(pool.timeline()[2].delta, -5);
  EXPECT_EQ(pool.timeline()[2].category, Category::kActivations);
  EXPECT_LE(pool.timeline()[0].seconds, pool.timeline()[2].seconds);
}

MemoryPool::Options caching(uint64_t cap, uint64_t scale, OomMode mode = OomMode::kStrict, uint64_t reserve = 0) {
  MemoryPool::Options options = capped(cap, mode, reserve);
  options.allocator = AllocatorKind::kCaching;
  options.scale = scale;
  return options;
}

constexpr uint64_t kMiB = 1ull << 20;

// A run shrunk by k = 2 (scale k² = 4): a 1-byte tensor is a 4-byte one at full scale, which takes a 2 MiB
// small-pool segment; the device holds 2 MiB / 4 = 512 KiB of it, beside the 1 byte allocated.
TEST(MemoryPool, CachingAllocatorSeesFullScaleSizes) {
  MemoryPool pool(caching(kNoCap, 4));
  const auto tiny = pool.charge(1, Category::kActivations);
  EXPECT_EQ(pool.in_use(), 1u) << "allocated bytes are counted as before";
  EXPECT_EQ(pool.reserved(), 512 * 1024u);
  // 3 MiB at shrunk scale is 12 MiB at full scale: a 12 MiB segment (>= 10 MiB: rounded to 2 MiB), 3 MiB shrunk.
  (void)pool.charge(3 * kMiB, Category::kParameters);
  EXPECT_EQ(pool.reserved(), 512 * 1024 + 3 * kMiB);
  pool.release(tiny);
  EXPECT_EQ(pool.reserved(), 512 * 1024 + 3 * kMiB) << "freed blocks stay cached";
  EXPECT_EQ(pool.reserved_peak(), 512 * 1024 + 3 * kMiB);
  EXPECT_EQ(pool.allocated_at_reserved_peak(), 3 * kMiB + 1);
}

// The reserve is the driver's: it is held beside the allocator's segments and leaves them cap - reserve.
TEST(MemoryPool, CachingAllocatorLeavesTheReserveOutside) {
  MemoryPool pool(caching(30 * kMiB, 1, OomMode::kStrict, 8 * kMiB));
  EXPECT_EQ(pool.reserved(), 8 * kMiB);
  (void)pool.charge(3 * kMiB, Category::kParameters);  // a 20 MiB segment: 28 MiB held
  EXPECT_EQ(pool.reserved(), 28 * kMiB);
  (void)pool.charge(3 * kMiB, Category::kParameters);  // from the segment's 17 MiB remainder
  EXPECT_EQ(pool.reserved(), 28 * kMiB);
  // 15 MiB would fit an exact count (8 + 6 + 15 = 29 <= 30) but not the 14 MiB remainder, and a new 16 MiB
  // segment would hold 28 + 16 > 30.
  EXPECT_THROW((void)pool.charge(15 * kMiB, Category::kParameters), OutOfMemoryError);
  // Segments may fill cap - reserve = 22 MiB: two 12 MiB tensors (two 12 MiB segments) pass it, though they would
  // fit in 30 MiB were the reserve left out.
  MemoryPool other(caching(30 * kMiB, 1, OomMode::kStrict, 8 * kMiB));
  (void)other.charge(12 * kMiB, Category::kParameters);
  EXPECT_THROW((void)other.charge(12 * kMiB, Category::kParameters), OutOfMemoryError);
}

// The fragmentation pattern of caching_allocator_test (nine 6 MiB tensors in three 20 MiB segments, every other
// one freed, then 12 MiB) under a 60 MiB cap: the caching allocator runs out (reserved would be 72 MiB), the
// exact count fits (24 + 12 = 36 MiB); record mode goes on over the cap and the message reads like PyTorch's.
TEST(MemoryPool, FragmentationIsAnOutOfMemoryOnlyWithTheCachingAllocator) {
  for (const AllocatorKind kind : {AllocatorKind::kCaching, AllocatorKind::kExact}) {
    MemoryPool::Options options = caching(60 * kMiB, 1, OomMode::kRecord);
    options.allocator = kind;
    MemoryPool pool(options);
    pool.set_phase("backward, block 3");
    std::vector<MemoryPool::Charge> charges;
    charges.reserve(9);
    for (int i = 0; i < 9; ++i) charges.push_back(pool.charge(6 * kMiB, Category::kActivations));
    for (size_t i = 0; i < charges.size(); i += 2) pool.release(charges[i]);
    (void)pool.charge(12 * kMiB, Category::kTemporaries, "attention scores");
    EXPECT_EQ(pool.in_use(), 36 * kMiB);
    if (kind == AllocatorKind::kExact) {
      EXPECT_FALSE(pool.first_oom().has_value());
      EXPECT_EQ(pool.reserved(), 36 * kMiB);
      continue;
    }
    ASSERT_TRUE(pool.first_oom().has_value());
    const OomEvent& oom = *pool.first_oom();
    EXPECT_EQ(oom.in_use, 24 * kMiB);
    EXPECT_EQ(oom.reserved, 60 * kMiB);
    EXPECT_EQ(pool.reserved(), 72 * kMiB) << "served past the cap from a 12 MiB segment";
    EXPECT_EQ(pool.reserved_peak(), 72 * kMiB);
    const std::string message = oom.message();
    EXPECT_NE(message.find("total capacity of 60.00 MiB of which 0 B is free"), std::string::npos) << message;
    EXPECT_NE(message.find("24.00 MiB is allocated by PyTorch, and 36.00 MiB is reserved by PyTorch but unallocated"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"), std::string::npos) << message;
    EXPECT_NE(message.find("during backward, block 3"), std::string::npos) << message;
  }
}

TEST(Device, BuffersChargeLogicalBytesAndReleaseOnDestruction) {
  auto device = make_cpu_device(capped(1000));
  {
    Buffer weights = device->allocate(100, DType::kBF16, Category::kParameters, "weights");
    Buffer master = device->allocate(100, DType::kF32, Category::kMasterWeights, "master");
    EXPECT_EQ(weights.bytes(), 200u);
    EXPECT_EQ(device->memory().in_use(Category::kParameters), 200u);
    EXPECT_EQ(device->memory().in_use(), 600u);
    ASSERT_NE(weights.data(), nullptr);
    EXPECT_EQ(weights.as<uint16_t>()[99], 0) << "buffers start zero-filled";
    Buffer moved = std::move(master);
    EXPECT_FALSE(master.allocated());  // NOLINT(bugprone-use-after-move): the moved-from state is what is tested
    EXPECT_EQ(device->memory().in_use(), 600u);
    EXPECT_THROW(device->allocate(101, DType::kF32, Category::kTemporaries), OutOfMemoryError);
  }
  EXPECT_EQ(device->memory().in_use(), 0u);
  EXPECT_EQ(device->memory().peak(), 600u);
}

TEST(Device, ShapesOnlyChargesButHoldsNothing) {
  auto device = make_shapes_device(capped(kNoCap));
  Buffer huge = device->allocate(70'000'000'000ull, DType::kBF16, Category::kParameters);
  EXPECT_EQ(huge.data(), nullptr);
  EXPECT_FALSE(device->holds_data());
  EXPECT_EQ(device->memory().in_use(), 140'000'000'000ull);
}

}  // namespace
}  // namespace emu
