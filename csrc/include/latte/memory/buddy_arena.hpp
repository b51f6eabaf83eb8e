#pragma once
// BuddyArena: one region reserved up front from an upstream resource, carved by a buddy
// allocator (large requests) fronted by size-class slabs (small requests). Thread-safe.
// Paged, the region is a reserved range of virtual addresses several times the capacity, and
// physical pages are mapped under each block as it is taken (detail/page_table.hpp): a large
// block is contiguous in addresses only, so a request fails only when its pages are not there.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "latte/memory/buddy_allocator.hpp"
#include "latte/memory/memory_resource.hpp"

namespace latte::memory {
namespace detail {
class SlabCache;
class PageMapper;
class PageTable;
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
  // Paged arenas only (page_bytes 0 otherwise): reserved counts the pages live blocks touch.
  std::size_t page_bytes = 0;
  std::size_t address_range = 0;   // bytes of reserved virtual addresses the buddy carves
  std::size_t mapped = 0;          // bytes of pages mapped now: touched by live blocks, or idle
  std::size_t physical_held = 0;   // bytes of physical pages holding memory
  std::uint64_t map_calls = 0;
  std::uint64_t unmap_calls = 0;
  std::size_t mapped_total = 0;    // bytes those map calls mapped
  std::size_t warm = 0;            // bytes of freed large blocks kept whole and mapped for reuse
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
  // Paged: the capacity is the mapper's physical pages; the buddy carves its virtual range.
  explicit BuddyArena(std::unique_ptr<detail::PageMapper> pages, ArenaOptions options = {});
  ~BuddyArena() override;
  BuddyArena(const BuddyArena&) = delete;
  BuddyArena& operator=(const BuddyArena&) = delete;

  ArenaUsage usage() const;
  // Throws logic_error naming the first broken invariant (also run after every operation
  // in builds with LATTE_DEBUG_CHECKS).
  void check_invariants() const;

  // Returns cached empty slabs to the buddy (done automatically before reporting out of memory)
  // and, paged, unmaps idle pages and returns their memory to the system.
  void release_cached() noexcept;
  bool paged() const noexcept { return pages_ != nullptr; }
  // What backs a paged arena's pages ("memfd", "memfd-hugetlb"); "" when not paged.
  const char* page_kind() const noexcept;

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
  void make_slabs();
  void* block_at(std::uint32_t head) noexcept;
  void note_peak_reserved() noexcept;
  void* take_head(std::uint32_t units) noexcept;
  void free_block(std::uint32_t head) noexcept;
  void* take_warm(std::uint32_t units) noexcept;
  bool keep_warm(std::uint32_t head, std::uint32_t units) noexcept;
  void release_warm() noexcept;
  [[noreturn]] void throw_out_of_memory(std::size_t bytes) const;
  void check_invariants_locked() const;

  MemoryResource* upstream_;  // null when paged
  ArenaOptions options_;
  unsigned unit_shift_;
  std::size_t capacity_;  // bytes of memory
  std::size_t span_;      // bytes of addresses the buddy carves: the capacity, or paged the virtual range
  std::byte* base_;
  mutable std::mutex buddy_mutex_;
  BuddyAllocator buddy_;
  std::atomic<std::size_t> large_allocated_{0};  // rounded bytes of live buddy allocations (not slabs)
  std::size_t peak_reserved_ = 0;                // guarded by buddy_mutex_
  std::atomic<std::size_t> peak_allocated_{0};
  std::unique_ptr<detail::SlabCache> slabs_;
  std::unique_ptr<detail::PageTable> pages_;  // guarded by buddy_mutex_
  bool short_of_pages_ = false;               // the last failed take lacked pages, not addresses
  bool map_refused_ = false;                  // the last failed take's map was refused by the system
  // Paged: freed blocks of a page or more kept whole and mapped, by length in units, for the
  // next request of that length (no page bookkeeping, no system call), as a caching allocator
  // keeps blocks; all go back when a large request is of another length, when a take finds no
  // room, and on release_cached. Guarded by buddy_mutex_.
  std::unordered_map<std::uint32_t, std::vector<std::uint32_t>> warm_;
  std::size_t warm_blocks_ = 0;
  std::size_t warm_bytes_ = 0;
#ifdef LATTE_DEBUG_CHECKS
  // Debug builds serialise whole operations so the full check sees a quiescent arena.
  mutable std::mutex debug_mutex_;
#endif
};

}  // namespace latte::memory
