#include "latte/memory/buddy_arena.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "latte/error.hpp"
#include "latte/memory/detail/page_table.hpp"
#include "latte/memory/detail/size_classes.hpp"

namespace latte::memory {
namespace {

using detail::PageMapper;
using detail::PageTable;
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
    : upstream_(&upstream),
      options_(options),
      unit_shift_(checked_unit_shift(options.min_block)),
      capacity_(checked_capacity(capacity, options.min_block)),
      span_(capacity_),
      base_(static_cast<std::byte*>(upstream.allocate(capacity_))),
      buddy_(static_cast<std::uint32_t>(span_ >> unit_shift_)) {
  make_slabs();
}

BuddyArena::BuddyArena(std::unique_ptr<PageMapper> pages, ArenaOptions options)
    : upstream_(nullptr),
      options_(options),
      unit_shift_(checked_unit_shift(options.min_block)),
      capacity_(static_cast<std::size_t>(pages->physical_pages()) * pages->page_bytes()),
      span_(checked_capacity(static_cast<std::size_t>(pages->virtual_pages()) * pages->page_bytes(), options.min_block)),
      base_(pages->base()),
      buddy_(static_cast<std::uint32_t>(span_ >> unit_shift_)),
      pages_(std::make_unique<PageTable>(std::move(pages))) {
  LATTE_EXPECTS(pages_->mapper().page_bytes() % options_.min_block == 0, "page_bytes must be a multiple of min_block");
  make_slabs();
}

void BuddyArena::make_slabs() {
  if (!options_.size_classes) return;
  LATTE_EXPECTS(options_.min_block <= SizeClassTable::kSlabBytes,
                "min_block above 64 KiB leaves no room for size-class slabs");
  slabs_ = std::make_unique<SlabCache>(
      base_, span_, [this](std::size_t bytes) { return take_block(bytes); },
      [this](void* block) { return_block(block); });
}

BuddyArena::~BuddyArena() {
  slabs_.reset();
  if (upstream_ != nullptr) upstream_->deallocate(base_, capacity_);
  pages_.reset();  // the mapper unmaps its whole range
}

const char* BuddyArena::page_kind() const noexcept { return pages_ ? pages_->mapper().kind() : ""; }

void* BuddyArena::block_at(std::uint32_t head) noexcept {
  const std::size_t offset = static_cast<std::size_t>(head) << unit_shift_;
  if (pages_) {
    const std::size_t length = static_cast<std::size_t>(buddy_.length_of(head)) << unit_shift_;
    const PageTable::Shortage shortage = pages_->acquire(offset, length);
    if (shortage != PageTable::Shortage::none) {
      short_of_pages_ = shortage == PageTable::Shortage::physical;
      map_refused_ = shortage == PageTable::Shortage::mapping;
      buddy_.free(head);
      return nullptr;
    }
  }
  note_peak_reserved();
  return base_ + offset;
}

void BuddyArena::note_peak_reserved() noexcept {
  const std::size_t reserved =
      pages_ ? static_cast<std::size_t>(pages_->counts().in_use) * pages_->mapper().page_bytes() - warm_bytes_
             : capacity_ - (static_cast<std::size_t>(buddy_.free_units()) << unit_shift_);
  peak_reserved_ = std::max(peak_reserved_, reserved);
}

void BuddyArena::free_block(std::uint32_t head) noexcept {
  if (pages_) {
    pages_->release(static_cast<std::size_t>(head) << unit_shift_,
                    static_cast<std::size_t>(buddy_.length_of(head)) << unit_shift_);
  }
  buddy_.free(head);
}

void* BuddyArena::try_allocate(std::size_t bytes) noexcept {
  if (slabs_ && bytes <= SizeClassTable::kSmallLimit) {
    // A new slab takes a whole slab-sized block; when none is left, the small request still
    // fits a smaller buddy block, so the arena fails only when no free block can hold it.
    if (void* ptr = slabs_->allocate(bytes)) return ptr;
  }
  if (bytes > capacity_) return nullptr;
  std::size_t rounded = bytes;
  const std::size_t page = pages_ ? pages_->mapper().page_bytes() : 0;
  // Paged, a request of a page or more takes whole pages: its block (aligned to its power of
  // two, at least a page) then shares no page, and a kept block holds exactly its pages.
  if (page && bytes >= page) rounded = (bytes + page - 1) / page * page;
  const auto units = static_cast<std::uint32_t>((rounded + options_.min_block - 1) >> unit_shift_);
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  void* ptr = nullptr;
  if (warm_blocks_ && page && bytes >= page) {
    ptr = take_warm(units);
    // Kept blocks of other lengths go back first: the request then lands at the lowest free
    // addresses, whose pages are mapped still, instead of beside the kept blocks on pages that
    // need mapping.
    if (ptr == nullptr) release_warm();
  }
  if (ptr == nullptr) ptr = take_head(units);
  if (ptr != nullptr) {
    const auto head = static_cast<std::uint32_t>((static_cast<std::byte*>(ptr) - base_) >> unit_shift_);
    large_allocated_.fetch_add(static_cast<std::size_t>(buddy_.length_of(head)) << unit_shift_,
                               std::memory_order_relaxed);
  }
  return ptr;
}

// A block of `units` from the buddy, its pages mapped when paged; the warm blocks go back
// first when there is no room for it. Needs buddy_mutex_.
void* BuddyArena::take_head(std::uint32_t units) noexcept {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const std::uint32_t head = buddy_.allocate(units, options_.trim);
    if (head == BuddyAllocator::npos) short_of_pages_ = map_refused_ = false;
    void* ptr = head == BuddyAllocator::npos ? nullptr : block_at(head);
    if (ptr != nullptr || warm_blocks_ == 0) return ptr;
    release_warm();
  }
  return nullptr;
}

void* BuddyArena::take_warm(std::uint32_t units) noexcept {
  auto found = warm_.find(units);
  if (found == warm_.end() || found->second.empty()) return nullptr;
  const std::uint32_t head = found->second.back();
  found->second.pop_back();
  --warm_blocks_;
  warm_bytes_ -= static_cast<std::size_t>(units) << unit_shift_;
  note_peak_reserved();
  return base_ + (static_cast<std::size_t>(head) << unit_shift_);
}

bool BuddyArena::keep_warm(std::uint32_t head, std::uint32_t units) noexcept {
  try {
    warm_[units].push_back(head);
  } catch (...) {  // no memory for the bookkeeping: the block goes back instead
    return false;
  }
  ++warm_blocks_;
  warm_bytes_ += static_cast<std::size_t>(units) << unit_shift_;
  return true;
}

void BuddyArena::release_warm() noexcept {
  for (auto& [units, heads] : warm_) {
    for (std::uint32_t head : heads) free_block(head);
  }
  warm_.clear();  // lengths seen once do not stay as keys
  warm_blocks_ = 0;
  warm_bytes_ = 0;
}

void BuddyArena::release_cached() noexcept {
  if (slabs_) slabs_->release_empty_slabs();
  if (pages_) {
    std::lock_guard<std::mutex> lock(buddy_mutex_);
    release_warm();
    pages_->trim();
  }
}

void* BuddyArena::take_block(std::size_t bytes) noexcept {
  const std::size_t units = (bytes + options_.min_block - 1) >> unit_shift_;
  if (units >= BuddyAllocator::npos) return nullptr;
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  return take_head(static_cast<std::uint32_t>(units));
}

void BuddyArena::return_block(void* ptr) noexcept {
  const auto head = static_cast<std::uint32_t>((static_cast<std::byte*>(ptr) - base_) >> unit_shift_);
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  free_block(head);
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
  if (ptr == nullptr) throw_out_of_memory(bytes);
  return ptr;
}

void BuddyArena::throw_out_of_memory(std::size_t bytes) const {
  const ArenaUsage u = usage();
  const std::string head = "BuddyArena: cannot allocate " + std::to_string(bytes) + " bytes: ";
  if (!pages_) {
    throw out_of_memory(head + "capacity " + std::to_string(u.capacity) + ", free " + std::to_string(u.free) +
                        ", largest free block " + std::to_string(u.largest_free) + " bytes");
  }
  bool short_of_pages, map_refused;
  {
    std::lock_guard<std::mutex> lock(buddy_mutex_);
    short_of_pages = short_of_pages_;
    map_refused = map_refused_;
  }
  if (map_refused) {
    throw out_of_memory(head + pages_->mapper().refusal());
  }
  if (short_of_pages || bytes > u.capacity) {
    throw out_of_memory(head + "live blocks hold " + std::to_string(u.reserved) + " of the " +
                        std::to_string(u.capacity) + "-byte capacity in pages of " + std::to_string(u.page_bytes) +
                        " bytes, and the request's pages do not fit in the rest");
  }
  throw out_of_memory(head + "no free run of the " + std::to_string(u.address_range) +
                      "-byte reserved address range holds it (the largest is " + std::to_string(u.largest_free) +
                      " bytes; " + std::to_string(u.free) + " bytes of pages are free)");
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
    if (static_cast<std::byte*>(ptr) < base_ || static_cast<std::byte*>(ptr) >= base_ + span_ ||
        (static_cast<std::byte*>(ptr) - base_) % options_.min_block != 0 || !buddy_.is_allocated_head(head)) {
      std::fprintf(stderr, "latte: BuddyArena::deallocate(%p): not a live block of this arena\n", ptr);
      std::abort();
    }
    if (auto kept = warm_.find(buddy_.length_of(head));
        kept != warm_.end() && std::find(kept->second.begin(), kept->second.end(), head) != kept->second.end()) {
      std::fprintf(stderr, "latte: BuddyArena::deallocate(%p): freed already (kept for reuse)\n", ptr);
      std::abort();
    }
#endif
    const std::uint32_t units = buddy_.length_of(head);
    large_allocated_.fetch_sub(static_cast<std::size_t>(units) << unit_shift_, std::memory_order_relaxed);
    // Paged, a block of a page or more stays whole and mapped for the next of its length.
    const bool warm = pages_ && options_.trim &&
                      (static_cast<std::size_t>(units) << unit_shift_) >= pages_->mapper().page_bytes() &&
                      keep_warm(head, units);
    if (!warm) free_block(head);
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
  if (p < base_ || p >= base_ + span_) return 0;
  const auto head = static_cast<std::uint32_t>((p - base_) >> unit_shift_);
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  if (!buddy_.is_allocated_head(head)) return 0;
  return static_cast<std::size_t>(buddy_.length_of(head)) << unit_shift_;
}

ArenaUsage BuddyArena::usage() const {
  ArenaUsage u;
  u.capacity = capacity_;
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  u.largest_free = static_cast<std::size_t>(buddy_.largest_free_units()) << unit_shift_;
  if (pages_) {
    const detail::PageCounts c = pages_->counts();
    u.page_bytes = c.page_bytes;
    u.address_range = span_;
    u.warm = warm_bytes_;
    u.reserved = static_cast<std::size_t>(c.in_use) * c.page_bytes - warm_bytes_;
    u.free = capacity_ - u.reserved;
    u.largest_free = std::min(u.largest_free, u.free);  // addresses to spare; the pages bound it
    u.mapped = static_cast<std::size_t>(c.in_use + c.idle) * c.page_bytes;
    u.physical_held = static_cast<std::size_t>(c.held) * c.page_bytes;
    u.map_calls = c.map_calls;
    u.unmap_calls = c.unmap_calls;
    u.mapped_total = static_cast<std::size_t>(c.mapped_pages) * c.page_bytes;
  } else {
    u.free = static_cast<std::size_t>(buddy_.free_units()) << unit_shift_;
    u.reserved = capacity_ - u.free;
  }
  u.allocated = large_allocated_.load(std::memory_order_relaxed) + (slabs_ ? slabs_->allocated_bytes() : 0);
  u.peak_reserved = peak_reserved_;
  u.peak_allocated = peak_allocated_.load(std::memory_order_relaxed);
  return u;
}

void BuddyArena::check_invariants_locked() const {
  if (slabs_) slabs_->check_invariants();
  std::lock_guard<std::mutex> lock(buddy_mutex_);
  buddy_.check_invariants();
  if (pages_) pages_->check_invariants();
  std::size_t blocks = 0, bytes = 0;
  for (const auto& [units, heads] : warm_) {
    std::vector<std::uint32_t> sorted(heads);
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      throw logic_error("BuddyArena invariant broken: a block is kept for reuse twice");
    }
    for (std::uint32_t head : heads) {
      if (!buddy_.is_allocated_head(head) || buddy_.length_of(head) != units) {
        throw logic_error("BuddyArena invariant broken: warm block at unit " + std::to_string(head) +
                          " is not an allocated block of " + std::to_string(units) + " units");
      }
      ++blocks;
      bytes += static_cast<std::size_t>(units) << unit_shift_;
    }
  }
  if (blocks != warm_blocks_ || bytes != warm_bytes_) {
    throw logic_error("BuddyArena invariant broken: warm blocks counted " + std::to_string(warm_blocks_) +
                      ", found " + std::to_string(blocks));
  }
}

void BuddyArena::check_invariants() const {
#ifdef LATTE_DEBUG_CHECKS
  std::lock_guard<std::mutex> debug_lock(debug_mutex_);
#endif
  check_invariants_locked();
}

}  // namespace latte::memory
