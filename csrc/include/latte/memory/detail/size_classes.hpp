#pragma once
// Implementation detail of BuddyArena. Size-class front end: small requests are served from slabs (one buddy block each) cut into
// equal slots, four classes per doubling, so rounding wastes ~10% instead of the ~44%
// of rounding to a power of two. Slab bookkeeping lives outside the managed memory.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace latte::memory::detail {

struct SizeClassTable {
  static constexpr std::size_t kAlignment = 64;       // cache line; every slot starts on one
  static constexpr std::size_t kSmallLimit = 4096;     // larger requests go to the buddy
  static constexpr std::size_t kSlabBytes = 64 * 1024;
  static constexpr unsigned kClasses = 20;

  static unsigned class_of(std::size_t bytes) noexcept;
  static std::size_t size_of(unsigned size_class) noexcept;
};

class SlabCache {
 public:
  // Slabs are taken from / returned to the buddy through these callbacks; both run while the
  // size class's own lock is held, never the other way round, so there is no lock cycle.
  using TakeBlock = std::function<void*(std::size_t bytes)>;      // nullptr when full
  using ReturnBlock = std::function<void(void* block)>;  // must not throw

  SlabCache(std::byte* base, std::size_t capacity, TakeBlock take, ReturnBlock give_back);
  ~SlabCache();
  SlabCache(const SlabCache&) = delete;
  SlabCache& operator=(const SlabCache&) = delete;

  // nullptr when no slab could be had.
  void* allocate(std::size_t bytes) noexcept;
  // True when ptr lies in a slab (and is then freed); false means it is a buddy block.
  bool deallocate(void* ptr) noexcept;
  // Hands every cached empty slab back to the buddy; returns how many were released.
  std::size_t release_empty_slabs() noexcept;
  // Rounded size of a live slot, 0 when ptr is not in a slab.
  std::size_t slot_size(const void* ptr) const noexcept;

  std::size_t allocated_bytes() const noexcept { return allocated_.load(std::memory_order_relaxed); }
  void check_invariants() const;

 private:
  struct Slab;
  struct ClassState;
  Slab* slab_of(const void* ptr) const noexcept;
  void release_slab(ClassState& cls, Slab* slab) noexcept;

  std::byte* base_;
  std::size_t capacity_;
  TakeBlock take_;
  ReturnBlock give_back_;
  std::unique_ptr<ClassState[]> classes_;
  // One entry per slab-sized, slab-aligned window of the arena: the slab living there or null.
  std::unique_ptr<std::atomic<Slab*>[]> slab_table_;
  std::size_t slab_table_size_;
  std::atomic<std::size_t> allocated_{0};
};

}  // namespace latte::memory::detail
