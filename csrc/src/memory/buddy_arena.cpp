#include "latte/memory/buddy_arena.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "latte/error.hpp"
#include "latte/memory/detail/size_classes.hpp"

namespace latte::memory {
namespace {

using detail::SizeClassTable;
using detail::SlabCache;

unsigned checked_unit_shift(std::size_t min_block) {
  LATTE_EXPECTS(min_block >= SizeClassTable::kAlignment && (min_block & (min_block - 1)) == 0,
                "min_block must be a power of two >= 64, got " + std::to_string(min_block));
  return static_cast<unsigned>(__builtin_ctzll(min_block));
}

std::size_t checked_capacity(std::size_t capacity, std::size_t min_block) {
  LATTE_EXPECTS(capacity >= min_block, "capacity must be at least min_block (" +
                                           std::to_string(min_block) + " bytes), got " +
                                           std::to_string(capacity));
  LATTE_EXPECTS(capacity / min_block < BuddyAllocator::npos,
                "capacity / min_block must stay below 2^32 units");
  return capacity - capacity % min_block;
}

}  // namespace

BuddyArena::BuddyArena(MemoryResource& upstream, std::size_t capacity, ArenaOptions options)
    : upstream_(upstream),
      options_(options),
      unit_shift_(checked_unit_shift(options.min_block)),
      capacity_(checked_capacity(capacity, options.min_block)),
      base_(static_cast<std::byte*>(upstream.allocate(capacity_))),
      buddy_(static_cast<std::uint32_t>(capacity_ >> unit_shift_)) {
  if (options_.size_classes) {
    LATTE_EXPECTS(options_.min_block <= SizeClassTable::kSlabBytes,
                  "min_block above 64 KiB leaves no room for size-class slabs");
    slabs_ = std::make_unique<SlabCache>(
        base_, capacity_, [this](std::size_t bytes) { return take_block(bytes); },
        [this](void* block) { return_block(block); });
  }
}

BuddyArena::~BuddyArena() {
  slabs_.reset();
  upstream_.deallocate(base_, capacity_);
}

void* BuddyArena::try_allocate(std::size_t bytes) noexcept {
  if (slabs_ && bytes <= SizeClassTable::kSmallLimit) {
    // A new slab takes a whole slab-sized block; when none is left, the small request still
    // fits a smaller buddy block, so the arena fails only when no free block can hold it.
    if (void* ptr = slabs_->allocate(bytes)) return ptr;
  }
  if (bytes > capacity_) return nullptr;
  const std::size_t units = (bytes + options_.min_block - 1) >> unit_shift_;
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  const std::uint32_t head = buddy_.allocate(static_cast<std::uint32_t>(units), options_.trim);
  if (head == BuddyAllocator::npos) return nullptr;
  large_allocated_.fetch_add(static_cast<std::size_t>(buddy_.length_of(head)) << unit_shift_,
                             std::memory_order_relaxed);
  peak_reserved_ = std::max(peak_reserved_, capacity_ - (static_cast<std::size_t>(buddy_.free_units()) << unit_shift_));
  return base_ + (static_cast<std::size_t>(head) << unit_shift_);
}

void BuddyArena::release_cached() noexcept {
  if (slabs_) slabs_->release_empty_slabs();
}

void* BuddyArena::take_block(std::size_t bytes) noexcept {
  const std::size_t units = (bytes + options_.min_block - 1) >> unit_shift_;
  if (units >= BuddyAllocator::npos) return nullptr;
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  const std::uint32_t head = buddy_.allocate(static_cast<std::uint32_t>(units), options_.trim);
  if (head == BuddyAllocator::npos) return nullptr;
  peak_reserved_ = std::max(peak_reserved_, capacity_ - (static_cast<std::size_t>(buddy_.free_units()) << unit_shift_));
  return base_ + (static_cast<std::size_t>(head) << unit_shift_);
}

void BuddyArena::return_block(void* ptr) noexcept {
  const auto head = static_cast<std::uint32_t>((static_cast<std::byte*>(ptr) - base_) >> unit_shift_);
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  buddy_.free(head);
}

void* BuddyArena::do_allocate(std::size_t bytes) {
  if (bytes == 0) return nullptr;
#ifdef LATTE_DEBUG_CHECKS
  std::lock_guard<std::mutex> debug_lock(debug_mutex_);
#endif
  void* ptr = try_allocate(bytes);
  // Empty slabs cached for reuse must not cause an out-of-memory: release them and retry.
  if (ptr == nullptr && slabs_ && slabs_->release_empty_slabs() > 0) ptr = try_allocate(bytes);
#ifdef LATTE_DEBUG_CHECKS
  check_invariants_locked();
#endif
  if (ptr != nullptr) {
    const std::size_t allocated = large_allocated_.load(std::memory_order_relaxed) +
                                  (slabs_ ? slabs_->allocated_bytes() : 0);
    std::size_t peak = peak_allocated_.load(std::memory_order_relaxed);
    while (allocated > peak && !peak_allocated_.compare_exchange_weak(peak, allocated, std::memory_order_relaxed)) {
    }
  }
  if (ptr == nullptr) {
    const ArenaUsage u = usage();
    throw out_of_memory("BuddyArena: cannot allocate " + std::to_string(bytes) +
                        " bytes: capacity " + std::to_string(u.capacity) + ", free " +
                        std::to_string(u.free) + ", largest free block " +
                        std::to_string(u.largest_free) + " bytes");
  }
  return ptr;
}

void BuddyArena::do_deallocate(void* ptr, std::size_t bytes) noexcept {
  (void)bytes;  // the arena finds the block from the pointer alone
  if (ptr == nullptr) return;
#ifdef LATTE_DEBUG_CHECKS
  std::lock_guard<std::mutex> debug_lock(debug_mutex_);
#endif
  if (!(slabs_ && slabs_->deallocate(ptr))) {
    const auto head = static_cast<std::uint32_t>((static_cast<std::byte*>(ptr) - base_) >> unit_shift_);
    std::lock_guard<std::mutex> lock(buddy_mutex_);
#ifdef LATTE_DEBUG_CHECKS
    // Freeing cannot report errors; a foreign or double-freed pointer stops a debug build here.
    if (static_cast<std::byte*>(ptr) < base_ || static_cast<std::byte*>(ptr) >= base_ + capacity_ ||
        (static_cast<std::byte*>(ptr) - base_) % options_.min_block != 0 || !buddy_.is_allocated_head(head)) {
      std::fprintf(stderr, "latte: BuddyArena::deallocate(%p): not a live block of this arena\n", ptr);
      std::abort();
    }
#endif
    large_allocated_.fetch_sub(static_cast<std::size_t>(buddy_.length_of(head)) << unit_shift_,
                               std::memory_order_relaxed);
    buddy_.free(head);
  }
#ifdef LATTE_DEBUG_CHECKS
  check_invariants_locked();
#endif
}

std::size_t BuddyArena::allocated_size(const void* ptr) const noexcept {
  if (slabs_) {
    if (std::size_t slot = slabs_->slot_size(ptr)) return slot;
  }
  const auto* p = static_cast<const std::byte*>(ptr);
  if (p < base_ || p >= base_ + capacity_) return 0;
  const auto head = static_cast<std::uint32_t>((p - base_) >> unit_shift_);
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  if (!buddy_.is_allocated_head(head)) return 0;
  return static_cast<std::size_t>(buddy_.length_of(head)) << unit_shift_;
}

ArenaUsage BuddyArena::usage() const {
  ArenaUsage u;
  u.capacity = capacity_;
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  u.free = static_cast<std::size_t>(buddy_.free_units()) << unit_shift_;
  u.reserved = capacity_ - u.free;
  u.largest_free = static_cast<std::size_t>(buddy_.largest_free_units()) << unit_shift_;
  u.allocated = large_allocated_.load(std::memory_order_relaxed) + (slabs_ ? slabs_->allocated_bytes() : 0);
  u.peak_reserved = peak_reserved_;
  u.peak_allocated = peak_allocated_.load(std::memory_order_relaxed);
  return u;
}

void BuddyArena::check_invariants_locked() const {
  if (slabs_) slabs_->check_invariants();
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  buddy_.check_invariants();
}

void BuddyArena::check_invariants() const {
#ifdef LATTE_DEBUG_CHECKS
  std::lock_guard<std::mutex> debug_lock(debug_mutex_);
#endif
  check_invariants_locked();
}

}  // namespace latte::memory
