// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator), one
// stream, over the exact sequence of allocations and frees a training step makes.
//
// A real GPU runs out of memory on the bytes this allocator has *reserved* from the driver (its segments), not on
// the bytes handed to tensors. It rounds every request up to 512 B; requests of at most 1 MiB come from the small
// pool, whose segments are 2 MiB; larger ones from the large pool, whose segments are 20 MiB for requests under
// 10 MiB and the request rounded up to 2 MiB otherwise. A request takes the smallest cached free block that fits
// (best fit), split when the remainder is large enough; a freed block merges with free neighbours of its own
// segment only. On a miss it reserves a new segment (cudaMalloc) if the device has room; if not, it frees cached
// blocks (first oversize ones under max_split_size_mb, then every cached unsplit segment) and tries once more;
// then it is out of memory. With expandable_segments:True each pool keeps one segment that grows by mapping
// pages (2 MiB small, 20 MiB large) at its end and unmaps free pages before giving up, so free space does not
// stay stranded across segments.
//
// Every operation is O(log n) in the number of blocks: free blocks sit in a std::set ordered by (size, address),
// as PyTorch's BlockPool. The sets' nodes come from a pool of their own and are reused, not taken from malloc on
// every split and merge (a plan replays millions of them; under AddressSanitizer each malloc costs ~10x).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <memory_resource>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace emu {

// The knobs of PYTORCH_CUDA_ALLOC_CONF that change which blocks are served and what is reserved.
struct AllocatorConfig {
  static constexpr uint64_t kNoMaxSplit = std::numeric_limits<uint64_t>::max();
  uint64_t max_split_size = kNoMaxSplit;  // bytes; blocks this large are not split (max_split_size_mb)
  bool expandable_segments = false;

  // PyTorch's own syntax, e.g. "expandable_segments:True,max_split_size_mb:128". A bad key or value is an
  // InputError naming the accepted ones (PyTorch's CUDAAllocatorConfig::parseArgs rules: max_split_size_mb must
  // be > 20, expandable_segments True or False).
  static AllocatorConfig parse(std::string_view text);
  std::string str() const;  // the same syntax back; "" for the defaults
};

class CachingAllocator {
 public:
  using BlockId = uint32_t;
  static constexpr BlockId kNoBlock = std::numeric_limits<BlockId>::max();
  // PyTorch's constants (CUDACachingAllocator.cpp / CachingDeviceAllocator.h).
  static constexpr uint64_t kMinBlockSize = 512;           // every size is rounded up to a multiple of this
  static constexpr uint64_t kSmallSize = 1ull << 20;       // largest request served by the small pool
  static constexpr uint64_t kSmallBuffer = 2ull << 20;     // small pool segments (and expandable small pages)
  static constexpr uint64_t kLargeBuffer = 20ull << 20;    // large segments for requests < kMinLargeAlloc
  static constexpr uint64_t kMinLargeAlloc = 10ull << 20;  // from here a segment is the request rounded
  static constexpr uint64_t kRoundLarge = 2ull << 20;      // ... up to this

  // `limit`: the bytes the device lets this allocator reserve (its capacity less what others hold).
  CachingAllocator(AllocatorConfig config, uint64_t limit);
  CachingAllocator(CachingAllocator&&) = default;  // the sets keep their nodes' pool
  CachingAllocator& operator=(CachingAllocator&&) = delete;

  // PyTorch's round_size and get_allocation_size.
  static uint64_t round_size(uint64_t size);
  static uint64_t allocation_size(uint64_t size);

  // Serves `size` bytes as PyTorch's malloc does; empty when reserved memory cannot serve it even after freeing
  // cached blocks: PyTorch's "CUDA out of memory" (the frees it tried stay done, as on the GPU).
  std::optional<BlockId> allocate(uint64_t size);
  // After allocate() came back empty: serves the request anyway from new memory past the limit, so a run that
  // records its first OOM can finish the step over the cap.
  BlockId allocate_past_limit(uint64_t size);
  void free(BlockId block);

  uint64_t allocated() const { return allocated_; }  // bytes in allocated blocks (rounded sizes)
  uint64_t reserved() const { return reserved_; }    // bytes in segments (mapped pages, when expandable)
  uint64_t limit() const { return limit_; }
  size_t segments() const { return segments_; }  // cudaMalloc'd segments and expandable segments alive
  uint64_t block_size(BlockId block) const { return blocks_[block].size; }
  const AllocatorConfig& config() const { return config_; }

 private:
  struct Block {
    uint64_t addr = 0;
    uint64_t size = 0;
    BlockId prev = kNoBlock;  // neighbours in the same segment
    BlockId next = kNoBlock;
    int32_t expandable = -1;  // index into expandable_, or -1 for a cudaMalloc'd segment
    bool small = false;       // pool
    bool allocated = false;
    bool mapped = true;  // false: an expandable segment's address range with no pages behind it
  };
  struct Pool {
    explicit Pool(std::pmr::memory_resource* nodes) : free(nodes), unmapped(nodes) {}
    std::pmr::set<std::tuple<uint64_t, uint64_t, BlockId>> free;  // (size, address, block): best fit
    std::pmr::set<std::pair<uint64_t, BlockId>> unmapped;         // (address, block)
  };
  struct Expandable {
    uint64_t base = 0;
    uint64_t page = 0;
    uint64_t size = 0;  // address space
    bool alive = false;
  };
  struct Request {
    uint64_t size;        // rounded
    uint64_t alloc_size;  // a new segment's size
    bool small;
    BlockId block = kNoBlock;
  };

  Pool& pool(bool small) { return pools_[small ? 0 : 1]; }
  BlockId new_block(const Block& block);
  void delete_block(BlockId id);
  void insert_free(BlockId id);
  void erase_free(BlockId id);
  Request request_for(uint64_t size) const;
  bool get_free_block(Request& r);
  bool alloc_block(Request& r, bool past_limit);
  bool release_available_cached_blocks(const Request& r);
  void release_cached_blocks();
  void release_blocks(bool small);
  void release_block(BlockId id);
  bool should_split(const Block& block, uint64_t size) const;
  BlockId serve(const Request& r);
  uint64_t try_merge_blocks(BlockId dst, BlockId src);
  bool fits(uint64_t bytes, bool past_limit) const;
  // Expandable segments.
  BlockId find_expandable_block(bool small, uint64_t size);
  bool map_block(BlockId id, uint64_t size, bool past_limit);
  void unmap_block(BlockId id);
  BlockId try_allocate_expandable_block(bool small, uint64_t size, bool past_limit);

  AllocatorConfig config_;
  uint64_t limit_;
  uint64_t allocated_ = 0;
  uint64_t reserved_ = 0;
  size_t segments_ = 0;
  uint64_t next_address_ = 1ull << 32;  // where the next segment starts: distinct, increasing addresses
  std::vector<Block> blocks_;
  std::vector<BlockId> unused_ids_;
  // The pools' set nodes; on the heap, so that a moved allocator's sets keep theirs.
  std::unique_ptr<std::pmr::unsynchronized_pool_resource> nodes_ =
      std::make_unique<std::pmr::unsynchronized_pool_resource>();
  Pool pools_[2] = {Pool(nodes_.get()), Pool(nodes_.get())};
  std::vector<Expandable> expandable_;
};

}  // namespace emu
