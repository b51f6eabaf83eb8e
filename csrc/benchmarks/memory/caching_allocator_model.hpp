#pragma once
// A simulation (addresses only, no memory) of a best-fit caching allocator modelled on
// PyTorch's CUDA caching allocator: sizes rounded to 512 B; requests <= 1 MiB served from
// 2 MiB segments, < 10 MiB from 20 MiB segments, larger ones from segments rounded to 2 MiB;
// best fit over cached free blocks, splitting, merging neighbours on free; segments are only
// given back (all fully free ones) when a new segment would exceed the capacity.
#include <cstdint>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

namespace latte::bench {

class CachingAllocatorModel {
 public:
  static constexpr std::uint64_t kRound = 512;
  static constexpr std::uint64_t kSmallSize = 1 << 20;
  static constexpr std::uint64_t kSmallBuffer = 2 << 20;
  static constexpr std::uint64_t kLargeBuffer = 20 << 20;
  static constexpr std::uint64_t kMinLargeAlloc = 10 << 20;
  static constexpr std::uint64_t kRoundLarge = 2 << 20;

  explicit CachingAllocatorModel(std::uint64_t capacity) : capacity_(capacity) {}

  struct Block {
    std::uint64_t addr, size;
    bool free;
    bool small_pool;
    Block* prev = nullptr;
    Block* next = nullptr;
  };

  // nullptr when the capacity is exhausted even after releasing the cache.
  Block* allocate(std::uint64_t bytes) {
    const std::uint64_t size = (bytes + kRound - 1) / kRound * kRound;
    const bool small = size <= kSmallSize;
    auto& pool = small ? small_free_ : large_free_;
    auto it = pool.lower_bound(Key{size, 0, nullptr});
    Block* block = nullptr;
    if (it != pool.end()) {
      block = it->block;
      pool.erase(it);
    } else {
      const std::uint64_t segment = small ? kSmallBuffer
                                    : size < kMinLargeAlloc ? kLargeBuffer
                                    : (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
      if (reserved_ + segment > capacity_) release_free_segments();
      if (reserved_ + segment > capacity_) return nullptr;
      blocks_.push_back(std::make_unique<Block>(Block{next_addr_, segment, true, small}));
      block = blocks_.back().get();
      next_addr_ += segment;
      reserved_ += segment;
    }
    const std::uint64_t remaining = block->size - size;
    if (small ? remaining >= kRound : remaining > kSmallSize) {
      blocks_.push_back(std::make_unique<Block>(Block{block->addr + size, remaining, true, small}));
      Block* rest = blocks_.back().get();
      rest->prev = block;
      rest->next = block->next;
      if (block->next) block->next->prev = rest;
      block->next = rest;
      block->size = size;
      pool.insert(key(rest));
    }
    block->free = false;
    allocated_ += block->size;
    return block;
  }

  void free(Block* block) {
    allocated_ -= block->size;
    block->free = true;
    auto& pool = block->small_pool ? small_free_ : large_free_;
    for (Block* neighbour : {block->prev, block->next}) {
      if (neighbour == nullptr || !neighbour->free) continue;
      pool.erase(key(neighbour));
      if (neighbour == block->prev) {
        neighbour->size += block->size;
        neighbour->next = block->next;
        if (block->next) block->next->prev = neighbour;
        block->size = 0;  // merged away; storage stays in blocks_
        block = neighbour;
      } else {
        block->size += neighbour->size;
        block->next = neighbour->next;
        if (neighbour->next) neighbour->next->prev = block;
        neighbour->size = 0;
      }
    }
    pool.insert(key(block));
  }

  std::uint64_t reserved() const { return reserved_; }
  std::uint64_t allocated() const { return allocated_; }
  // Free space = cached free blocks + capacity never reserved; the unreserved part counts as
  // one piece (generous to the model: device memory outside it may be fragmented too).
  std::uint64_t free_bytes() const { return capacity_ - reserved_ + cached_free(); }
  std::uint64_t largest_free() const {
    std::uint64_t largest = capacity_ - reserved_;
    if (!small_free_.empty()) largest = std::max(largest, small_free_.rbegin()->size);
    if (!large_free_.empty()) largest = std::max(largest, large_free_.rbegin()->size);
    return largest;
  }

 private:
  struct Key {
    std::uint64_t size, addr;
    Block* block;
    bool operator<(const Key& o) const { return std::tie(size, addr) < std::tie(o.size, o.addr); }
  };
  static Key key(Block* b) { return Key{b->size, b->addr, b}; }

  std::uint64_t cached_free() const {
    std::uint64_t total = 0;
    for (const auto* pool : {&small_free_, &large_free_}) {
      for (const Key& k : *pool) total += k.size;
    }
    return total;
  }

  void release_free_segments() {
    for (auto* pool : {&small_free_, &large_free_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = it->block;
        if (b->prev == nullptr && b->next == nullptr) {
          reserved_ -= b->size;
          b->size = 0;
          it = pool->erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  std::uint64_t capacity_;
  std::uint64_t reserved_ = 0;
  std::uint64_t allocated_ = 0;
  std::uint64_t next_addr_ = 0;
  std::set<Key> small_free_, large_free_;
  std::vector<std::unique_ptr<Block>> blocks_;
};

}  // namespace latte::bench
