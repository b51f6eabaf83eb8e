#pragma once
// Implementation detail of BuddyArena's paged mode. The arena's buddy carves a reserved range
// of virtual addresses several times the capacity; physical memory comes in fixed pages,
// mapped under a block's virtual pages when the block is taken, from any free physical page.
// So a large block never needs contiguous physical memory, and a request fails only when the
// pages are not there. A page stays mapped while any block touches it; when none does it is
// kept mapped (idle) and reused without a system call. Idle pages are unmapped, oldest first,
// when another range needs their physical pages: when no free page is left, and, where the
// mapper sets an idle share, when taking free pages that hold no memory yet would make the
// pages held exceed those in use by more than that share, so the memory held follows
// what live blocks touch instead of every range they ever touched. Pages are counted from
// free lists, never searched. Not thread-safe: BuddyArena serialises access.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace latte::memory::detail {

// The system side: one reserved virtual range and a pool of physical pages, and the calls
// that put a run of physical pages under a run of virtual pages and take them away.
class PageMapper {
 public:
  virtual ~PageMapper() = default;

  virtual std::byte* base() const noexcept = 0;
  virtual std::size_t page_bytes() const noexcept = 0;
  virtual std::uint32_t virtual_pages() const noexcept = 0;
  virtual std::uint32_t physical_pages() const noexcept = 0;
  // What backs the pages, for logs and stats ("memfd", "memfd-hugetlb", "cuda").
  virtual const char* kind() const noexcept = 0;

  // Maps physical pages [physical, physical + count) at virtual pages [first, first + count);
  // false when the system refuses, with the range left inaccessible.
  virtual bool map(std::uint32_t first, std::uint32_t physical, std::uint32_t count) noexcept = 0;
  // Makes virtual pages [first, first + count) inaccessible again; the range stays reserved.
  // False when the system refuses: the pages stay mapped as they were.
  virtual bool unmap(std::uint32_t first, std::uint32_t count) noexcept = 0;
  // Makes each of the single virtual pages `pages[0..count)` inaccessible, in turn, and stops
  // at the first the system refuses; returns how many it unmapped (the rest stay as they were).
  // One call for the pages an eviction takes, so a device waits for its kernels once.
  virtual std::uint32_t unmap_each(const std::uint32_t* pages, std::uint32_t count) noexcept {
    std::uint32_t done = 0;
    while (done < count && unmap(pages[done], 1)) ++done;
    return done;
  }
  // Returns physical pages [physical, physical + count), mapped nowhere, to the system.
  virtual void discard(std::uint32_t physical, std::uint32_t count) noexcept = 0;
  // Idle pages kept beyond the pages in use: at most that many / idle_share() (and
  // PageTable::kIdleFloor pages whatever the use); 0 keeps every idle page until the memory
  // runs out. Remapping a page costs a device little next to the memory it holds; on the
  // host the page is faulted in again when touched, and one large block after another of
  // other sizes would pay that every time.
  virtual std::uint32_t idle_share() const noexcept { return 0; }
  // What a refused map or unmap most likely means here, for the error the request gets.
  virtual const char* refusal() const noexcept { return "the system refused a map or an unmap"; }
};

// The physical pages of a capacity and the virtual pages of the range reserved for it,
// virtual_factor times as many; throws naming the option when they cannot be had (a capacity
// below one page, a factor below two, more pages than the table counts).
struct PageSpan {
  std::uint32_t physical_pages;
  std::uint32_t virtual_pages;
};
PageSpan page_span(std::size_t capacity, std::size_t page_bytes, unsigned virtual_factor);

struct PageCounts {
  std::size_t page_bytes = 0;
  std::uint32_t physical_pages = 0;  // the capacity, in pages
  std::uint32_t in_use = 0;          // mapped and touched by a live block
  std::uint32_t idle = 0;            // mapped, touched by none: reused without a system call
  std::uint32_t free = 0;            // physical pages mapped nowhere
  std::uint32_t held = 0;            // physical pages holding memory (mapped, or touched and not discarded)
  std::uint32_t peak_in_use = 0;
  std::uint64_t map_calls = 0;
  std::uint64_t unmap_calls = 0;    // an eviction's pages count as one call (one wait on a device)
  std::uint64_t mapped_pages = 0;    // pages mapped by those calls, for the cost per MiB
};

class PageTable {
 public:
  enum class Shortage { none, physical, mapping };

  explicit PageTable(std::unique_ptr<PageMapper> mapper);
  ~PageTable();
  PageTable(const PageTable&) = delete;
  PageTable& operator=(const PageTable&) = delete;

  PageMapper& mapper() noexcept { return *mapper_; }
  const PageMapper& mapper() const noexcept { return *mapper_; }

  // Idle pages a mapper's idle share keeps whatever the use, so a small arena does not unmap
  // on every range it moves to.
  static constexpr std::uint32_t kIdleFloor = 4;

  // Backs every page of [offset, offset + bytes) of the range for one more block: idle pages
  // are reused, missing ones mapped from free physical pages, evicting the least recently
  // idle pages of other ranges when no free one is left or when the idle pages would pass
  // the mapper's idle share. Shortage::physical: the range's
  // missing pages exceed the free and idle pages together (nothing changed); Shortage::mapping:
  // the system refused a map, or the unmap of an idle page it needed (the range is as it was;
  // idle pages of other ranges evicted for it stay unmapped, their physical pages free).
  Shortage acquire(std::size_t offset, std::size_t bytes) noexcept;
  // One block fewer touches each page of [offset, offset + bytes); pages no block touches
  // become idle, still mapped.
  void release(std::size_t offset, std::size_t bytes) noexcept;
  // Pages [offset, offset + bytes) would take how many physical pages they do not have now.
  std::uint32_t missing(std::size_t offset, std::size_t bytes) const noexcept;
  // Unmaps every idle page and returns its memory to the system; returns how many. An idle
  // page the system refuses to unmap stays idle, and the rest stay as they are.
  std::uint32_t trim() noexcept;

  PageCounts counts() const noexcept;
  // Throws logic_error naming the first broken invariant.
  void check_invariants() const;

 private:
  static constexpr std::uint32_t kNone = 0xFFFFFFFFu;
  void link_idle(std::uint32_t page) noexcept;
  void unlink_idle(std::uint32_t page) noexcept;
  // Unmaps the `count` least recently idle pages and frees their physical pages; false when
  // the system refuses one (it and those after it stay idle, now the most recent, and the
  // acquire that needed them fails as a refused map).
  bool evict(std::uint32_t count) noexcept;
  bool map_missing(std::uint32_t first, std::uint32_t last) noexcept;

  std::unique_ptr<PageMapper> mapper_;
  unsigned page_shift_;
  std::vector<std::uint32_t> users_;   // per virtual page: live blocks touching it
  std::vector<std::uint32_t> frame_;   // per virtual page: its physical page, or kNone
  std::vector<std::uint32_t> free_;    // physical pages mapped nowhere; the next taken is at the back
  std::vector<std::uint8_t> held_;     // per physical page: holds memory (touched, not discarded)
  std::vector<std::uint8_t> fresh_;    // per virtual page: mapped by the acquire under way (undone if it fails)
  std::vector<std::uint32_t> evicting_;  // the pages of the eviction under way (room for every physical page)
  // Idle pages in the order they became idle (evicted oldest first): a list through the pages.
  std::vector<std::uint32_t> prev_, next_;
  std::uint32_t idle_head_ = kNone, idle_tail_ = kNone;
  std::uint32_t idle_ = 0, in_use_ = 0, held_count_ = 0, peak_in_use_ = 0;
  std::uint64_t map_calls_ = 0, unmap_calls_ = 0, mapped_pages_ = 0;
};

}  // namespace latte::memory::detail
