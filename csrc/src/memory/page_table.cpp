#include "latte/memory/detail/page_table.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "latte/error.hpp"

namespace latte::memory::detail {
namespace {

unsigned checked_page_shift(std::size_t page_bytes) {
  LATTE_EXPECTS(page_bytes != 0 && (page_bytes & (page_bytes - 1)) == 0,
                "page_bytes must be a power of two, got " + std::to_string(page_bytes));
  return static_cast<unsigned>(__builtin_ctzll(page_bytes));
}

void expect(bool condition, const std::string& what) {
  if (!condition) throw logic_error("PageTable invariant broken: " + what);
}

}  // namespace

PageSpan page_span(std::size_t capacity, std::size_t page_bytes, unsigned virtual_factor) {
  // Twice the capacity at least: a request of more than half of it needs an aligned run of
  // addresses that a range of one capacity may not have free.
  LATTE_EXPECTS(virtual_factor >= 2, "virtual_factor must be at least 2");
  LATTE_EXPECTS(capacity >= page_bytes, "capacity must hold at least one page (" + std::to_string(page_bytes) +
                                            " bytes), got " + std::to_string(capacity));
  const std::size_t physical = capacity / page_bytes, virtual_pages = physical * virtual_factor;
  // Below the largest count: that value marks "no page" in the table.
  LATTE_EXPECTS(virtual_pages < std::numeric_limits<std::uint32_t>::max(), "too many pages: raise page_bytes");
  return {static_cast<std::uint32_t>(physical), static_cast<std::uint32_t>(virtual_pages)};
}

PageTable::PageTable(std::unique_ptr<PageMapper> mapper)
    : mapper_(std::move(mapper)), page_shift_(checked_page_shift(mapper_->page_bytes())) {
  const std::uint32_t pages = mapper_->virtual_pages(), frames = mapper_->physical_pages();
  LATTE_EXPECTS(frames > 0 && pages >= frames, "the virtual range must hold at least the physical pages");
  users_.assign(pages, 0);
  frame_.assign(pages, kNone);
  fresh_.assign(pages, 0);
  prev_.assign(pages, kNone);
  next_.assign(pages, kNone);
  held_.assign(frames, 0);
  evicting_.assign(frames, 0);  // no more pages can be idle than have physical pages
  // Taken from the back: the lowest physical pages first, in order, so a fresh range maps
  // with one call per run.
  free_.reserve(frames);
  for (std::uint32_t f = frames; f-- > 0;) free_.push_back(f);
}

PageTable::~PageTable() = default;

void PageTable::link_idle(std::uint32_t page) noexcept {
  prev_[page] = idle_tail_;
  next_[page] = kNone;
  if (idle_tail_ != kNone) next_[idle_tail_] = page; else idle_head_ = page;
  idle_tail_ = page;
  ++idle_;
}

void PageTable::unlink_idle(std::uint32_t page) noexcept {
  const std::uint32_t before = prev_[page], after = next_[page];
  if (before != kNone) next_[before] = after; else idle_head_ = after;
  if (after != kNone) prev_[after] = before; else idle_tail_ = before;
  prev_[page] = next_[page] = kNone;
  --idle_;
}

bool PageTable::evict(std::uint32_t count) noexcept {
  count = std::min(count, idle_);
  if (count == 0) return true;
  for (std::uint32_t i = 0; i < count; ++i) {
    evicting_[i] = idle_head_;
    unlink_idle(idle_head_);
  }
  ++unmap_calls_;
  const std::uint32_t unmapped = mapper_->unmap_each(evicting_.data(), count);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint32_t page = evicting_[i];
    if (i < unmapped) {
      free_.push_back(frame_[page]);  // never reallocates: reserved for every physical page
      frame_[page] = kNone;
    } else {  // still mapped: its physical page must not be handed out again
      link_idle(page);
    }
  }
  return unmapped == count;
}

std::uint32_t PageTable::missing(std::size_t offset, std::size_t bytes) const noexcept {
  if (bytes == 0) return 0;
  const auto first = static_cast<std::uint32_t>(offset >> page_shift_);
  const auto last = static_cast<std::uint32_t>((offset + bytes - 1) >> page_shift_);
  std::uint32_t count = 0;
  for (std::uint32_t p = first; p <= last; ++p) count += frame_[p] == kNone;
  return count;
}

bool PageTable::map_missing(std::uint32_t first, std::uint32_t last) noexcept {
  std::uint32_t p = first, refused_start = kNone, refused_count = 0;
  bool mapped = true;
  while (p <= last && mapped) {
    if (frame_[p] != kNone) {
      ++p;
      continue;
    }
    // One call for a run of virtual pages whose physical pages leave the free list in order.
    const std::uint32_t start = p, physical = free_.back();
    std::uint32_t count = 0;
    while (p <= last && frame_[p] == kNone && !free_.empty() && free_.back() == physical + count) {
      frame_[p] = physical + count;
      fresh_[p] = 1;
      free_.pop_back();
      ++p;
      ++count;
    }
    ++map_calls_;
    mapped = mapper_->map(start, physical, count);
    if (!mapped) {  // the mapper left these inaccessible: nothing to unmap
      refused_start = start;
      refused_count = count;
    } else {
      mapped_pages_ += count;
      for (std::uint32_t f = physical; f < physical + count; ++f) {
        if (!held_[f]) {
          held_[f] = 1;
          ++held_count_;
        }
      }
    }
  }
  // A refused map: every page this call mapped goes back, the highest frame first so that the
  // free list hands the lowest out next, in order. One whose unmap is refused too keeps its
  // frame, so that its physical page is never mapped twice; acquire makes it idle.
  for (std::uint32_t q = last + 1; q-- > first;) {
    if (!fresh_[q]) continue;
    fresh_[q] = 0;
    if (mapped) continue;
    const bool refused_here = q >= refused_start && q - refused_start < refused_count;
    if (!refused_here) {
      ++unmap_calls_;
      if (!mapper_->unmap(q, 1)) continue;
    }
    free_.push_back(frame_[q]);
    frame_[q] = kNone;
  }
  return mapped;
}

PageTable::Shortage PageTable::acquire(std::size_t offset, std::size_t bytes) noexcept {
  if (bytes == 0) return Shortage::none;
  const auto first = static_cast<std::uint32_t>(offset >> page_shift_);
  const auto last = static_cast<std::uint32_t>((offset + bytes - 1) >> page_shift_);
  std::uint32_t need = 0, idle_here = 0;
  for (std::uint32_t p = first; p <= last; ++p) {
    if (frame_[p] == kNone) ++need;
    else if (users_[p] == 0) ++idle_here;
  }
  if (need > free_.size() + (idle_ - idle_here)) return Shortage::physical;
  // This range's idle pages are its own again: out of the eviction order before evicting.
  for (std::uint32_t p = first; p <= last; ++p) {
    if (users_[p] == 0 && frame_[p] != kNone) unlink_idle(p);
  }
  // Evicted: what the free list lacks, and what keeps the pages held within the idle share.
  // The free pages that hold memory already are taken first (evicted ones go to the back).
  const std::uint32_t free_held = held_count_ - in_use_ - idle_ - idle_here;
  const std::uint32_t fresh = need > free_held ? need - free_held : 0;
  const std::uint32_t in_use_after = in_use_ + idle_here + need;
  const std::uint32_t divisor = mapper_->idle_share();
  const std::uint32_t share = divisor ? std::max(in_use_after / divisor, kIdleFloor) : 0;
  std::uint32_t evicted = free_.size() < need ? need - static_cast<std::uint32_t>(free_.size()) : 0;
  if (divisor && fresh > 0 && held_count_ + fresh > in_use_after + share) {
    // A share more than this range needs, so the next ranges find pages evicted already.
    evicted = std::max(evicted, std::min(fresh, held_count_ + fresh - in_use_after - share) + share);
  }
  evict(evicted);  // a refusal leaves the free list short, which fails the acquire below
  if (need > 0 && (free_.size() < need || !map_missing(first, last))) {
    for (std::uint32_t p = first; p <= last; ++p) {
      if (users_[p] == 0 && frame_[p] != kNone) link_idle(p);
    }
    return Shortage::mapping;
  }
  for (std::uint32_t p = first; p <= last; ++p) {
    if (users_[p]++ == 0) ++in_use_;
  }
  peak_in_use_ = std::max(peak_in_use_, in_use_);
  return Shortage::none;
}

void PageTable::release(std::size_t offset, std::size_t bytes) noexcept {
  if (bytes == 0) return;
  const auto first = static_cast<std::uint32_t>(offset >> page_shift_);
  const auto last = static_cast<std::uint32_t>((offset + bytes - 1) >> page_shift_);
  for (std::uint32_t p = first; p <= last; ++p) {
    if (--users_[p] == 0) {
      --in_use_;
      link_idle(p);
    }
  }
}

std::uint32_t PageTable::trim() noexcept {
  evict(idle_);
  std::uint32_t discarded = 0;
  for (std::uint32_t f : free_) {
    if (!held_[f]) continue;
    mapper_->discard(f, 1);
    held_[f] = 0;
    --held_count_;
    ++discarded;
  }
  return discarded;
}

PageCounts PageTable::counts() const noexcept {
  PageCounts c;
  c.page_bytes = mapper_->page_bytes();
  c.physical_pages = mapper_->physical_pages();
  c.in_use = in_use_;
  c.idle = idle_;
  c.free = static_cast<std::uint32_t>(free_.size());
  c.held = held_count_;
  c.peak_in_use = peak_in_use_;
  c.map_calls = map_calls_;
  c.unmap_calls = unmap_calls_;
  c.mapped_pages = mapped_pages_;
  return c;
}

void PageTable::check_invariants() const {
  const auto pages = static_cast<std::uint32_t>(users_.size());
  std::vector<std::uint8_t> seen(held_.size(), 0);
  std::uint32_t in_use = 0, idle = 0, held = 0;
  for (std::uint32_t p = 0; p < pages; ++p) {
    expect(!fresh_[p], "page " + std::to_string(p) + " still marked as mapped by an acquire under way");
    if (users_[p] > 0) {
      expect(frame_[p] != kNone, "page " + std::to_string(p) + " is used but has no physical page");
      ++in_use;
    } else if (frame_[p] != kNone) {
      ++idle;
    }
    if (frame_[p] != kNone) {
      expect(frame_[p] < held_.size() && !seen[frame_[p]], "physical page " + std::to_string(frame_[p]) +
                                                               " is mapped twice or does not exist");
      expect(held_[frame_[p]], "mapped physical page " + std::to_string(frame_[p]) + " is not counted as held");
      seen[frame_[p]] = 1;
    }
  }
  for (std::uint32_t f : free_) {
    expect(f < held_.size() && !seen[f], "free physical page " + std::to_string(f) + " is also mapped or listed twice");
    seen[f] = 1;
  }
  for (std::uint8_t s : seen) expect(s, "a physical page is neither mapped nor free");
  for (std::uint8_t h : held_) held += h;
  expect(in_use == in_use_, "pages in use: counted " + std::to_string(in_use_) + ", found " + std::to_string(in_use));
  expect(idle == idle_, "idle pages: counted " + std::to_string(idle_) + ", found " + std::to_string(idle));
  expect(held == held_count_, "held pages: counted " + std::to_string(held_count_) + ", found " + std::to_string(held));
  std::uint32_t listed = 0;
  for (std::uint32_t p = idle_head_, before = kNone; p != kNone; before = p, p = next_[p]) {
    expect(users_[p] == 0 && frame_[p] != kNone, "idle list holds page " + std::to_string(p) + ", which is not idle");
    expect(prev_[p] == before, "idle list broken at page " + std::to_string(p));
    expect(++listed <= idle_, "idle list longer than the idle count");
  }
  expect(listed == idle_, "idle list shorter than the idle count");
}

}  // namespace latte::memory::detail
