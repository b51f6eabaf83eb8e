#include "latte/memory/buddy_allocator.hpp"

#include <array>
#include <string>

#include "latte/error.hpp"

namespace latte::memory {
namespace {

constexpr std::uint8_t kFree = 0x80;
constexpr std::uint8_t kAllocated = 0x40;
constexpr std::uint8_t kOrderMask = 0x3F;
constexpr std::uint8_t kInterior = 0x3F;  // no flag: not the head of any block

unsigned floor_log2(std::uint64_t x) { return 63u - static_cast<unsigned>(__builtin_clzll(x)); }
unsigned ceil_log2(std::uint64_t x) { return x <= 1 ? 0u : floor_log2(x - 1) + 1; }
unsigned trailing_zeros(std::uint64_t x) { return static_cast<unsigned>(__builtin_ctzll(x)); }

}  // namespace

BuddyAllocator::BuddyAllocator(std::uint32_t units)
    : units_(units), tag_(units, kInterior), length_(units, 0) {
  LATTE_EXPECTS(units > 0 && units < npos, "buddy range must hold between 1 and 2^32-2 units");
  max_order_ = floor_log2(units);
  free_.resize(max_order_ + 1);
  for (unsigned order = 0; order <= max_order_; ++order) free_[order].reset(units >> order);
  // A range that is not a power of two starts as the largest aligned blocks that tile it.
  std::uint32_t pos = 0;
  while (pos < units) {
    unsigned order = floor_log2(units - pos);
    if (pos != 0 && trailing_zeros(pos) < order) order = trailing_zeros(pos);
    push_free(pos, order);
    pos += 1u << order;
  }
  free_units_ = units;
}

void BuddyAllocator::push_free(std::uint32_t head, unsigned order) noexcept {
  tag_[head] = static_cast<std::uint8_t>(kFree | order);
  free_[order].insert(head >> order);
  nonempty_orders_ |= 1ull << order;
}

void BuddyAllocator::unlink_free(std::uint32_t head, unsigned order) noexcept {
  free_[order].erase(head >> order);
  if (free_[order].empty()) nonempty_orders_ &= ~(1ull << order);
  tag_[head] = kInterior;
}

std::uint32_t BuddyAllocator::pop_lowest_free(unsigned order) noexcept {
  const std::uint32_t head = free_[order].lowest() << order;
  unlink_free(head, order);
  return head;
}

std::uint32_t BuddyAllocator::allocate(std::uint32_t units, bool trim) noexcept {
  if (units == 0 || units > units_) return npos;
  const unsigned order = ceil_log2(units);
  if (order > max_order_) return npos;
  const std::uint64_t fitting = nonempty_orders_ >> order;
  if (fitting == 0) return npos;
  unsigned found = order + trailing_zeros(fitting);
  const std::uint32_t head = pop_lowest_free(found);
  // Split down: each upper half becomes a free block one order smaller.
  while (found > order) {
    --found;
    push_free(head + (1u << found), found);
  }
  std::uint32_t length = 1u << order;
  if (trim && units < length) {
    // The tail splits into aligned pieces whose buddies all overlap the allocation,
    // so none of them could have coalesced: plain pushes suffice.
    std::uint32_t pos = head + units;
    const std::uint32_t end = head + length;
    while (pos < end) {
      unsigned piece = trailing_zeros(pos - head);
      while ((1u << piece) > end - pos) --piece;
      push_free(pos, piece);
      pos += 1u << piece;
    }
    length = units;
  }
  tag_[head] = static_cast<std::uint8_t>(kAllocated | order);
  length_[head] = length;
  free_units_ -= length;
  return head;
}

void BuddyAllocator::free_block(std::uint32_t head, unsigned order) noexcept {
  while (order < max_order_) {
    const std::uint32_t buddy = head ^ (1u << order);
    if (static_cast<std::uint64_t>(buddy) + (1u << order) > units_) break;
    if (tag_[buddy] != (kFree | order)) break;
    unlink_free(buddy, order);
    if (buddy < head) {
      tag_[head] = kInterior;
      head = buddy;
    }
    ++order;
  }
  push_free(head, order);
}

void BuddyAllocator::free(std::uint32_t head) noexcept {
  const std::uint32_t length = length_[head];
  tag_[head] = kInterior;
  free_units_ += length;
  // A trimmed allocation is the binary decomposition of its length, largest piece first;
  // freeing from the tail end lets each piece meet its already-free buddy.
  std::uint32_t end = head + length;
  std::uint32_t remaining = length;
  while (remaining != 0) {
    const unsigned piece = trailing_zeros(remaining);
    end -= 1u << piece;
    remaining -= 1u << piece;
    free_block(end, piece);
  }
}

bool BuddyAllocator::is_allocated_head(std::uint32_t head) const noexcept {
  return head < units_ && (tag_[head] & kAllocated) != 0;
}

std::uint32_t BuddyAllocator::largest_free_units() const noexcept {
  return nonempty_orders_ == 0 ? 0u : 1u << floor_log2(nonempty_orders_);
}

void BuddyAllocator::check_invariants() const {
  auto fail = [](const std::string& what) {
    throw logic_error("buddy invariant broken: " + what);
  };
  std::array<std::uint32_t, kMaxOrders> free_blocks_per_order{};
  std::uint64_t free_seen = 0;
  std::uint64_t used_seen = 0;
  std::uint32_t pos = 0;
  while (pos < units_) {
    const std::uint8_t tag = tag_[pos];
    const unsigned order = tag & kOrderMask;
    std::uint32_t length = 0;
    if (tag & kFree) {
      length = 1u << order;
      if (pos % length != 0) fail("free block at unit " + std::to_string(pos) + " misaligned");
      const std::uint32_t buddy = pos ^ length;
      if (order < max_order_ && static_cast<std::uint64_t>(buddy) + length <= units_ &&
          tag_[buddy] == tag) {
        fail("free buddies at units " + std::to_string(pos) + " and " + std::to_string(buddy) +
             " were not coalesced");
      }
      ++free_blocks_per_order[order];
      free_seen += length;
    } else if (tag & kAllocated) {
      length = length_[pos];
      if (length == 0 || length > (1u << order) || pos % (1u << order) != 0) {
        fail("allocated block at unit " + std::to_string(pos) + " has a bad length/order");
      }
      used_seen += length;
    } else {
      fail("unit " + std::to_string(pos) + " is reached by the walk but heads no block");
    }
    if (static_cast<std::uint64_t>(pos) + length > units_) fail("block runs past the range");
    for (std::uint32_t i = pos + 1; i < pos + length; ++i) {
      if (tag_[i] != kInterior) fail("blocks overlap at unit " + std::to_string(i));
    }
    pos += length;
  }
  if (used_seen + free_seen != units_) fail("used + free != capacity");
  if (free_seen != free_units_) fail("free unit counter disagrees with the blocks");
  for (unsigned order = 0; order < kMaxOrders; ++order) {
    const std::uint32_t count = order <= max_order_ ? free_[order].count() : 0;
    if (count != free_blocks_per_order[order]) fail("free set " + std::to_string(order) + " size wrong");
    if (((nonempty_orders_ >> order) & 1u) != (count != 0)) fail("non-empty order mask wrong");
    if (order > max_order_) continue;
    if (!free_[order].summaries_consistent()) fail("free set " + std::to_string(order) + " summary bits wrong");
    for (std::uint32_t pos2 = 0; pos2 < units_; pos2 += 1u << order) {
      if (free_[order].contains(pos2 >> order) && tag_[pos2] != (kFree | order)) {
        fail("free set " + std::to_string(order) + " holds a non-free block at unit " + std::to_string(pos2));
      }
    }
  }
}

}  // namespace latte::memory
