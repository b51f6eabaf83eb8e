#pragma once
// BuddyArena: one region reserved up front from an upstream resource, carved by a buddy
// allocator (large requests) fronted by size-class slabs (small requests). Thread-safe.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "latte/memory/buddy_allocator.hpp"
#include "latte/memory/memory_resource.hpp"

namespace latte::memory {
namespace detail {
class SlabCache;
}  // namespace detail

// Occupancy of an arena.
struct ArenaUsage {
  std::size_t capacity = 0;       // bytes managed
  std::size_t reserved = 0;       // bytes taken out of the buddy lists (blocks and slabs)
  std::size_t allocated = 0;      // bytes of live allocations after rounding
  std::size_t free = 0;           // capacity - reserved
  std::size_t largest_free = 0;   // largest single free block
  std::size_t peak_reserved = 0;
  std::size_t peak_allocated = 0;
};

struct ArenaOptions {
  std::size_t min_block = 256;  // power of two; every buddy block is aligned to it
  bool size_classes = true;     // serve requests <= 4 KiB from slabs
  bool trim = true;             // give a block's unused tail back (waste < min_block)
};

class BuddyArena final : public MemoryResource {
 public:
  // Reserves `capacity` bytes (rounded down to min_block) from `upstream`, which must
  // outlive the arena.
  BuddyArena(MemoryResource& upstream, std::size_t capacity, ArenaOptions options = {});
  ~BuddyArena() override;
  BuddyArena(const BuddyArena&) = delete;
  BuddyArena& operator=(const BuddyArena&) = delete;

  ArenaUsage usage() const;
  // Throws logic_error naming the first broken invariant (also run after every operation
  // in builds with LATTE_DEBUG_CHECKS).
  void check_invariants() const;

  // Returns cached empty slabs to the buddy (done automatically before reporting out of memory).
  void release_cached() noexcept;

  std::byte* base() const noexcept { return base_; }
  std::size_t capacity() const noexcept { return capacity_; }
  const ArenaOptions& options() const noexcept { return options_; }
  // Rounded size the arena holds for a live allocation at ptr.
  std::size_t allocated_size(const void* ptr) const noexcept;

 private:
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* ptr, std::size_t bytes) noexcept override;
  void* try_allocate(std::size_t bytes) noexcept;
  void* take_block(std::size_t bytes) noexcept;
  void return_block(void* ptr) noexcept;
  void check_invariants_locked() const;

  MemoryResource& upstream_;
  ArenaOptions options_;
  unsigned unit_shift_;
  std::size_t capacity_;
  std::byte* base_;
  mutable std::mutex buddy_mutex_;
  BuddyAllocator buddy_;
  std::atomic<std::size_t> large_allocated_{0};  // rounded bytes of live buddy allocations (not slabs)
  std::size_t peak_reserved_ = 0;                // guarded by buddy_mutex_
  std::atomic<std::size_t> peak_allocated_{0};
  std::unique_ptr<detail::SlabCache> slabs_;
#ifdef LATTE_DEBUG_CHECKS
  // Debug builds serialise whole operations so the full check sees a quiescent arena.
  mutable std::mutex debug_mutex_;
#endif
};

}  // namespace latte::memory
