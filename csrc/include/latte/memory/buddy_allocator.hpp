#pragma once
// The binary buddy algorithm over a range of equal "units" (the minimum block), with all
// bookkeeping kept outside the managed memory so it works for device memory as well.
// Free blocks of each order are kept in an address-ordered set (a hierarchical bitmap), and
// the lowest-addressed fitting block is taken: this packs long-lived blocks low and leaves
// large runs free at the top, where LIFO free lists scatter them (measured in
// docs/benchmarks.md). Not thread-safe: BuddyArena serialises access.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "latte/memory/detail/index_bitmap.hpp"

namespace latte::memory {

class BuddyAllocator {
 public:
  static constexpr std::uint32_t npos = 0xFFFFFFFFu;
  static constexpr unsigned kMaxOrders = 33;

  // Manages units [0, units); units need not be a power of two.
  explicit BuddyAllocator(std::uint32_t units);

  // Returns the first unit of a block of at least `units` units, or npos when no block fits.
  // With `trim`, the unused tail of the power-of-two block goes straight back to the free
  // lists, so a request wastes less than one unit instead of up to half the block.
  std::uint32_t allocate(std::uint32_t units, bool trim) noexcept;

  // Frees the allocation starting at `head`; coalesces with free buddies.
  void free(std::uint32_t head) noexcept;

  bool is_allocated_head(std::uint32_t head) const noexcept;
  std::uint32_t length_of(std::uint32_t head) const noexcept { return length_[head]; }

  std::uint32_t total_units() const noexcept { return units_; }
  std::uint32_t free_units() const noexcept { return free_units_; }
  std::uint32_t largest_free_units() const noexcept;

  // Walks the whole structure; throws logic_error naming the first broken invariant.
  void check_invariants() const;

 private:
  void push_free(std::uint32_t head, unsigned order) noexcept;
  void unlink_free(std::uint32_t head, unsigned order) noexcept;
  std::uint32_t pop_lowest_free(unsigned order) noexcept;
  void free_block(std::uint32_t head, unsigned order) noexcept;

  std::uint32_t units_;
  std::uint32_t free_units_ = 0;
  unsigned max_order_ = 0;
  std::uint64_t nonempty_orders_ = 0;  // bit k set <=> free list k non-empty; finds a fit in O(1)
  // free_[k] holds head >> k of every free block of order k.
  std::vector<detail::IndexBitmap> free_;
  // Per unit, meaningful only at block heads: the tag says free/allocated and the order.
  std::vector<std::uint8_t> tag_;
  // At allocated heads: the allocation's length in units.
  std::vector<std::uint32_t> length_;
};

}  // namespace latte::memory
