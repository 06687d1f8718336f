#include "emu/caching_allocator.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "emu/check.h"

namespace emu {
namespace {

constexpr std::string_view kAcceptedKeys = "expandable_segments:True|False, max_split_size_mb:N (N > 20)";

// PyTorch's CUDAAllocatorConfig::lexArgs: ',' and ':' are tokens of their own, spaces vanish.
std::vector<std::string> lex(std::string_view text) {
  std::vector<std::string> tokens;
  std::string word;
  for (const char c : text) {
    if (c == ',' || c == ':') {
      if (!word.empty()) tokens.push_back(std::move(word));
      word.clear();
      tokens.emplace_back(1, c);
    } else if (c != ' ') {
      word += c;
    }
  }
  if (!word.empty()) tokens.push_back(std::move(word));
  return tokens;
}

[[noreturn]] void bad_conf(std::string_view text, const std::string& why) {
  throw InputError(fmt::format("--alloc-conf '{}': {}; accepted (PYTORCH_CUDA_ALLOC_CONF syntax, comma-separated): {}",
                               text, why, kAcceptedKeys));
}

uint64_t ceil_to(uint64_t size, uint64_t unit) { return (size + unit - 1) / unit * unit; }

}  // namespace

AllocatorConfig AllocatorConfig::parse(std::string_view text) {
  AllocatorConfig config;
  const std::vector<std::string> tokens = lex(text);
  for (size_t i = 0; i < tokens.size(); i += 4) {
    const std::string& key = tokens[i];
    if (key != "expandable_segments" && key != "max_split_size_mb")
      bad_conf(text, fmt::format("unknown key '{}'", key));
    if (i + 2 >= tokens.size() || tokens[i + 1] != ":") bad_conf(text, fmt::format("'{}' needs ':' and a value", key));
    const std::string& value = tokens[i + 2];
    if (i + 3 < tokens.size() && tokens[i + 3] != ",") bad_conf(text, fmt::format("expected ',' after '{}'", value));
    if (key == "expandable_segments") {
      if (value != "True" && value != "False") {
        bad_conf(text, fmt::format("expandable_segments takes True or False, not '{}'", value));
      }
      config.expandable_segments = value == "True";
    } else {
      uint64_t mb = 0;
      const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), mb);
      if (error != std::errc() || end != value.data() + value.size() || mb <= CachingAllocator::kLargeBuffer >> 20) {
        bad_conf(text, fmt::format("max_split_size_mb takes a whole number of MiB above {}, not '{}'",
                                   CachingAllocator::kLargeBuffer >> 20, value));
      }
      config.max_split_size = mb >= (kNoMaxSplit >> 20) ? kNoMaxSplit : mb << 20;
    }
  }
  return config;
}

std::string AllocatorConfig::str() const {
  std::string text;
  if (expandable_segments) text = "expandable_segments:True";
  if (max_split_size != kNoMaxSplit) {
    text += fmt::format("{}max_split_size_mb:{}", text.empty() ? "" : ",", max_split_size >> 20);
  }
  return text;
}

CachingAllocator::CachingAllocator(AllocatorConfig config, uint64_t limit) : config_(config), limit_(limit) {}

uint64_t CachingAllocator::round_size(uint64_t size) {
  return size < kMinBlockSize ? kMinBlockSize : ceil_to(size, kMinBlockSize);
}

uint64_t CachingAllocator::allocation_size(uint64_t size) {
  if (size <= kSmallSize) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return ceil_to(size, kRoundLarge);
}

CachingAllocator::BlockId CachingAllocator::new_block(const Block& block) {
  if (unused_ids_.empty()) {
    blocks_.push_back(block);
    return static_cast<BlockId>(blocks_.size() - 1);
  }
  const BlockId id = unused_ids_.back();
  unused_ids_.pop_back();
  blocks_[id] = block;
  return id;
}

void CachingAllocator::delete_block(BlockId id) { unused_ids_.push_back(id); }

void CachingAllocator::insert_free(BlockId id) {
  const Block& b = blocks_[id];
  pool(b.small).free.emplace(b.size, b.addr, id);
}

void CachingAllocator::erase_free(BlockId id) {
  const Block& b = blocks_[id];
  pool(b.small).free.erase({b.size, b.addr, id});
}

CachingAllocator::Request CachingAllocator::request_for(uint64_t size) const {
  // Sizes past 2^62 would overflow the rounding; no device has them, and such a request is out of memory anyway.
  const uint64_t rounded = round_size(std::min(size, uint64_t{1} << 62));
  return Request{rounded, allocation_size(rounded), rounded <= kSmallSize};
}

bool CachingAllocator::fits(uint64_t bytes, bool past_limit) const {
  return past_limit || (bytes <= limit_ && reserved_ <= limit_ - bytes);
}

std::optional<CachingAllocator::BlockId> CachingAllocator::allocate(uint64_t size) {
  Request r = request_for(size);
  const bool found = get_free_block(r) || alloc_block(r, false) ||
                     (release_available_cached_blocks(r) && alloc_block(r, false)) ||
                     (release_cached_blocks(), alloc_block(r, false));
  if (!found) return std::nullopt;
  return serve(r);
}

CachingAllocator::BlockId CachingAllocator::allocate_past_limit(uint64_t size) {
  Request r = request_for(size);
  EMU_CHECK(alloc_block(r, true), "a block past the limit could not be made");
  return serve(r);
}

// get_free_block: the smallest free block of the pool that fits, unless max_split_size_mb forbids it.
bool CachingAllocator::get_free_block(Request& r) {
  Pool& p = pool(r.small);
  auto it = p.free.lower_bound({r.size, 0, 0});
  if (it == p.free.end()) return false;
  if (blocks_[std::get<2>(*it)].expandable >= 0) {
    // A block at the mapped end of an expandable segment counts as large as it could grow; a smaller fit later
    // in the order is preferred to it.
    const auto expandable_size = [this](BlockId id) {
      const Block& b = blocks_[id];
      return b.size + (b.next != kNoBlock && !blocks_[b.next].mapped ? blocks_[b.next].size : 0);
    };
    auto next = std::next(it);
    while (blocks_[std::get<2>(*it)].expandable >= 0 && next != p.free.end() &&
           expandable_size(std::get<2>(*next)) < expandable_size(std::get<2>(*it))) {
      it = next++;
    }
  }
  const uint64_t found = std::get<0>(*it);
  const uint64_t max_split = config_.max_split_size;
  // An oversize block serves no request under max_split_size, and an oversize request only a block less than
  // kLargeBuffer bigger than it.
  if (r.size < max_split && found >= max_split) return false;
  if (r.size >= max_split && found >= r.size + kLargeBuffer) return false;
  r.block = std::get<2>(*it);
  p.free.erase(it);
  return true;
}

// alloc_block: a new segment (cudaMalloc) of alloc_size, or pages mapped into an expandable segment.
bool CachingAllocator::alloc_block(Request& r, bool past_limit) {
  if (config_.expandable_segments) {
    r.block = try_allocate_expandable_block(r.small, r.size, past_limit);
    return r.block != kNoBlock;
  }
  if (!fits(r.alloc_size, past_limit)) return false;
  reserved_ += r.alloc_size;
  ++segments_;
  r.block = new_block(Block{.addr = next_address_, .size = r.alloc_size, .small = r.small});
  next_address_ += ceil_to(r.alloc_size, kRoundLarge);
  return true;
}

// release_available_cached_blocks: with max_split_size_mb set, frees cached oversize segments, the smallest one
// that covers the request or else the largest ones until they add up to it.
bool CachingAllocator::release_available_cached_blocks(const Request& r) {
  const uint64_t max_split = config_.max_split_size;
  if (max_split == AllocatorConfig::kNoMaxSplit) return false;
  Pool& p = pool(r.small);
  const uint64_t key = std::max(r.size, max_split);
  auto it = p.free.lower_bound({key, 0, 0});
  if (it == p.free.end() || blocks_[std::get<2>(*it)].expandable >= 0) {
    if (it == p.free.begin()) return false;
    uint64_t released = 0;
    --it;
    while (released < key && std::get<0>(*it) >= max_split) {
      const BlockId current = std::get<2>(*it);
      const bool first = it == p.free.begin();
      if (!first) --it;
      if (blocks_[current].expandable < 0) {
        released += blocks_[current].size;
        release_block(current);
      }
      if (first) break;
    }
    return released >= key;
  }
  release_block(std::get<2>(*it));
  return true;
}

// release_cached_blocks: every cached segment no tensor uses goes back to the driver; expandable segments unmap
// their free pages.
void CachingAllocator::release_cached_blocks() {
  release_blocks(false);
  release_blocks(true);
}

void CachingAllocator::release_blocks(bool small) {
  Pool& p = pool(small);
  std::vector<BlockId> to_unmap;
  for (auto it = p.free.begin(); it != p.free.end();) {
    const BlockId id = std::get<2>(*it++);
    const Block& b = blocks_[id];
    if (b.expandable >= 0) {
      to_unmap.push_back(id);
    } else if (b.prev == kNoBlock && b.next == kNoBlock) {
      release_block(id);
    }
  }
  for (const BlockId id : to_unmap) {
    unmap_block(id);
    const Block& b = blocks_[id];
    if (!b.mapped && b.prev == kNoBlock && b.next == kNoBlock) {  // the whole address range is free: drop it
      expandable_[static_cast<size_t>(b.expandable)].alive = false;
      p.unmapped.erase({b.addr, id});
      delete_block(id);
      --segments_;
    }
  }
}

void CachingAllocator::release_block(BlockId id) {
  const Block& b = blocks_[id];
  EMU_CHECK(b.prev == kNoBlock && b.next == kNoBlock && b.expandable < 0, "releasing part of a segment");
  erase_free(id);
  reserved_ -= b.size;
  --segments_;
  delete_block(id);
}

bool CachingAllocator::should_split(const Block& block, uint64_t size) const {
  const uint64_t remaining = block.size - size;
  if (block.small || config_.expandable_segments) return remaining >= kMinBlockSize;
  return size < config_.max_split_size && remaining > kSmallSize;
}

// alloc_found_block: the block found, split when should_split says so; the front part is handed out.
CachingAllocator::BlockId CachingAllocator::serve(const Request& r) {
  BlockId id = r.block;
  if (should_split(blocks_[id], r.size)) {
    const BlockId remaining = id;
    Block front = blocks_[remaining];
    front.size = r.size;
    front.next = remaining;
    id = new_block(front);
    Block& rest = blocks_[remaining];  // after new_block: it may have moved
    if (rest.prev != kNoBlock) blocks_[rest.prev].next = id;
    rest.prev = id;
    rest.addr += r.size;
    rest.size -= r.size;
    insert_free(remaining);
  }
  blocks_[id].allocated = true;
  allocated_ += blocks_[id].size;
  return id;
}

void CachingAllocator::free(BlockId id) {
  Block& b = blocks_[id];
  EMU_CHECK(b.allocated, "freeing block {} that is not allocated", id);
  b.allocated = false;
  allocated_ -= b.size;
  try_merge_blocks(id, b.prev);
  try_merge_blocks(id, blocks_[id].next);
  insert_free(id);
}

// try_merge_blocks: `src`, a free neighbour in the same segment (and as mapped as `dst`), joins `dst`, which is in
// no set at the time. Returns the bytes it brought.
uint64_t CachingAllocator::try_merge_blocks(BlockId dst, BlockId src) {
  if (src == kNoBlock || blocks_[src].allocated || blocks_[src].mapped != blocks_[dst].mapped) return 0;
  const Block s = blocks_[src];
  Block& d = blocks_[dst];
  if (d.prev == src) {
    d.addr = s.addr;
    d.prev = s.prev;
    if (d.prev != kNoBlock) blocks_[d.prev].next = dst;
  } else {
    d.next = s.next;
    if (d.next != kNoBlock) blocks_[d.next].prev = dst;
  }
  d.size += s.size;
  if (s.mapped) {
    pool(s.small).free.erase({s.size, s.addr, src});
  } else {
    pool(s.small).unmapped.erase({s.addr, src});
  }
  delete_block(src);
  return s.size;
}

// find_expandable_block: the lowest address where free and unmapped space together hold `size`, or a new
// expandable segment (address space for 9/8 of the device, as PyTorch reserves).
CachingAllocator::BlockId CachingAllocator::find_expandable_block(bool small, uint64_t size) {
  Pool& p = pool(small);
  const auto allocatable = [this](BlockId id) { return id != kNoBlock && !blocks_[id].allocated; };
  for (const auto& [addr, id] : p.unmapped) {
    BlockId candidate = id;
    if (allocatable(blocks_[id].prev)) candidate = blocks_[id].prev;
    uint64_t bytes = 0;
    for (BlockId b = candidate; bytes < size && allocatable(b); b = blocks_[b].next) bytes += blocks_[b].size;
    if (bytes >= size) return candidate;
  }
  Expandable segment;
  segment.page = small ? kSmallBuffer : kLargeBuffer;
  const uint64_t device = limit_ > (uint64_t{1} << 50) ? uint64_t{1} << 50 : limit_;
  segment.size = std::max(ceil_to(device + device / 8, segment.page), ceil_to(size, segment.page));
  segment.base = ceil_to(next_address_, kLargeBuffer);
  segment.alive = true;
  next_address_ = segment.base + segment.size;
  expandable_.push_back(segment);
  ++segments_;
  const BlockId id = new_block(Block{.addr = segment.base,
                                     .size = segment.size,
                                     .expandable = static_cast<int32_t>(expandable_.size() - 1),
                                     .small = small,
                                     .mapped = false});
  p.unmapped.emplace(segment.base, id);
  return id;
}

// map_block: pages behind the first `size` bytes of an unmapped block (whole pages); the rest stays unmapped.
bool CachingAllocator::map_block(BlockId id, uint64_t size, bool past_limit) {
  const Expandable& segment = expandable_[static_cast<size_t>(blocks_[id].expandable)];
  const uint64_t mapped = ceil_to(size, segment.page);
  if (!fits(mapped, past_limit)) return false;
  reserved_ += mapped;
  Pool& p = pool(blocks_[id].small);
  p.unmapped.erase({blocks_[id].addr, id});
  blocks_[id].mapped = true;
  if (mapped < blocks_[id].size) {
    Block rest = blocks_[id];
    rest.addr += mapped;
    rest.size -= mapped;
    rest.mapped = false;
    rest.prev = id;
    const BlockId rest_id = new_block(rest);
    Block& b = blocks_[id];
    if (b.next != kNoBlock) blocks_[b.next].prev = rest_id;
    b.next = rest_id;
    b.size = mapped;
    p.unmapped.emplace(rest.addr, rest_id);
  }
  try_merge_blocks(id, blocks_[id].prev);
  try_merge_blocks(id, blocks_[id].next);
  insert_free(id);
  return true;
}

// unmap_block: gives back the whole pages inside a free block; the partial pages at its ends stay mapped.
void CachingAllocator::unmap_block(BlockId id) {
  const Block b = blocks_[id];
  const Expandable& segment = expandable_[static_cast<size_t>(b.expandable)];
  const uint64_t begin = segment.base + ceil_to(b.addr - segment.base, segment.page);
  const uint64_t end = segment.base + (b.addr + b.size - segment.base) / segment.page * segment.page;
  if (begin >= end) return;
  erase_free(id);
  if (begin > b.addr) {  // prev -> before -> block
    Block before = b;
    before.size = begin - b.addr;
    before.next = id;
    const BlockId before_id = new_block(before);
    if (b.prev != kNoBlock) blocks_[b.prev].next = before_id;
    blocks_[id].prev = before_id;
    insert_free(before_id);
  }
  if (b.addr + b.size > end) {  // block -> after -> next
    Block after = b;
    after.addr = end;
    after.size = b.addr + b.size - end;
    after.prev = id;
    const BlockId after_id = new_block(after);
    if (b.next != kNoBlock) blocks_[b.next].prev = after_id;
    blocks_[id].next = after_id;
    insert_free(after_id);
  }
  Block& unmapped = blocks_[id];
  unmapped.addr = begin;
  unmapped.size = end - begin;
  unmapped.mapped = false;
  reserved_ -= end - begin;
  try_merge_blocks(id, unmapped.prev);
  try_merge_blocks(id, blocks_[id].next);
  pool(b.small).unmapped.emplace(blocks_[id].addr, id);
}

CachingAllocator::BlockId CachingAllocator::try_allocate_expandable_block(bool small, uint64_t size, bool past_limit) {
  BlockId candidate = find_expandable_block(small, size);
  // Either unmapped (then maybe free after it), or free then unmapped: map until the free run holds `size`.
  if (!blocks_[candidate].mapped && !map_block(candidate, std::min(blocks_[candidate].size, size), past_limit)) {
    return kNoBlock;
  }
  while (blocks_[candidate].size < size) {
    const BlockId next = blocks_[candidate].next;
    if (!map_block(next, std::min(size - blocks_[candidate].size, blocks_[next].size), past_limit)) return kNoBlock;
    candidate = next;  // map_block merged the candidate into it
  }
  erase_free(candidate);
  return candidate;
}

}  // namespace emu
