// BuddyArena's paged mode, as a C++ user sees it: blocks contiguous in addresses over any free
// physical pages, failures only when the pages are not there, mappings kept and reused.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../check.hpp"
#include "stress_loop.hpp"
#include "latte/error.hpp"
#include "latte/memory/buddy_arena.hpp"
#include "latte/memory/detail/page_table.hpp"
#include "latte/memory/host_pages.hpp"
#include "latte/memory/host_resource.hpp"

using namespace latte::memory;
using latte::out_of_memory;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t Page = 64 * KiB;

// Sixteen pages of 64 KiB behind a range four times that; slabs off unless asked for.
std::unique_ptr<BuddyArena> paged_arena(std::size_t pages = 16, bool size_classes = false) {
  return std::make_unique<BuddyArena>(std::make_unique<HostPages>(pages * Page, HostPagesOptions{Page, 4, true}),
                                      ArenaOptions{256, size_classes, true});
}

// Every other page-sized block freed: half the memory free, in pieces of one page.
std::vector<void*> checkerboard(BuddyArena& arena, std::size_t pages) {
  std::vector<void*> blocks, kept;
  for (std::size_t i = 0; i < pages; ++i) blocks.push_back(arena.allocate(Page));
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (i % 2) arena.deallocate(blocks[i], Page); else kept.push_back(blocks[i]);
  }
  return kept;
}

// Delegates to HostPages and refuses the map calls the test names.
class RefusingPages final : public detail::PageMapper {
 public:
  explicit RefusingPages(std::size_t capacity) : pages_(capacity, HostPagesOptions{Page, 4, true}) {}
  std::byte* base() const noexcept override { return pages_.base(); }
  std::size_t page_bytes() const noexcept override { return pages_.page_bytes(); }
  std::uint32_t virtual_pages() const noexcept override { return pages_.virtual_pages(); }
  std::uint32_t physical_pages() const noexcept override { return pages_.physical_pages(); }
  const char* kind() const noexcept override { return "refusing"; }
  bool map(std::uint32_t first, std::uint32_t physical, std::uint32_t count) noexcept override {
    if (refuse_) return false;
    return pages_.map(first, physical, count);
  }
  bool unmap(std::uint32_t first, std::uint32_t count) noexcept override {
    if (refuse_unmap_) return false;
    return pages_.unmap(first, count);
  }
  void discard(std::uint32_t physical, std::uint32_t count) noexcept override { pages_.discard(physical, count); }
  const char* refusal() const noexcept override { return pages_.refusal(); }
  bool* refuse() { return &refuse_; }
  bool* refuse_unmap() { return &refuse_unmap_; }

 private:
  HostPages pages_;
  bool refuse_ = false;
  bool refuse_unmap_ = false;
};

// No memory at all: the page table's bookkeeping alone, with map and unmap calls refused as
// the test says (the nth map call from now; every unmap).
class ScriptedPages final : public detail::PageMapper {
 public:
  explicit ScriptedPages(std::uint32_t physical = 8, std::uint32_t virtual_pages = 16, std::uint32_t idle_share = 0)
      : physical_(physical), virtual_(virtual_pages), idle_share_(idle_share) {}
  std::byte* base() const noexcept override { return nullptr; }
  std::size_t page_bytes() const noexcept override { return Page; }
  std::uint32_t virtual_pages() const noexcept override { return virtual_; }
  std::uint32_t physical_pages() const noexcept override { return physical_; }
  const char* kind() const noexcept override { return "scripted"; }
  std::uint32_t idle_share() const noexcept override { return idle_share_; }
  bool map(std::uint32_t, std::uint32_t, std::uint32_t) noexcept override { return ++maps != refuse_map; }
  bool unmap(std::uint32_t, std::uint32_t) noexcept override { return !refuse_unmaps && ++unmaps != refuse_unmap; }
  void discard(std::uint32_t, std::uint32_t) noexcept override {}
  int maps = 0, refuse_map = -1;
  int unmaps = 0, refuse_unmap = -1;  // the nth unmap call from the start is refused
  bool refuse_unmaps = false;

 private:
  std::uint32_t physical_, virtual_, idle_share_;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("a large block takes any free pages: half of a checkerboarded arena is one block") {
  auto arena = paged_arena();
  const auto kept = checkerboard(*arena, 16);
  // A plain buddy's largest free block here would be one page; paged, the 8 free pages serve.
  void* large = arena->allocate(8 * Page);
  std::memset(large, 0x5A, 8 * Page);
  for (void* p : kept) std::memset(p, 0x11, Page);  // the neighbours' pages are their own
  CHECK(static_cast<unsigned char*>(large)[8 * Page - 1] == 0x5A);
  const ArenaUsage u = arena->usage();
  CHECK(u.reserved == 16 * Page);
  CHECK(u.free == 0);
  arena->check_invariants();
}

TEST_CASE("a request fails only when its pages are not there, and says so") {
  auto arena = paged_arena();
  const auto kept = checkerboard(*arena, 16);
  std::string message;
  try {
    arena->allocate(9 * Page);  // eight pages are free
  } catch (const out_of_memory& e) {
    message = e.what();
  }
  CHECK(contains(message, "live blocks hold 524288 of the 1048576-byte capacity"));
  CHECK(contains(message, "pages do not fit"));
  void* fits = arena->allocate(8 * Page);  // exactly the free pages
  arena->deallocate(fits, 8 * Page);
  arena->check_invariants();
}

TEST_CASE("a warm free and allocation of a large block maps nothing") {
  auto arena = paged_arena();
  void* first = arena->allocate(5 * Page);
  const std::uint64_t maps = arena->usage().map_calls;
  arena->deallocate(first, 5 * Page);
  void* again = arena->allocate(5 * Page);
  CHECK(again == first);  // the lowest free run: the same addresses, still mapped
  CHECK(arena->usage().map_calls == maps);
  CHECK(arena->usage().unmap_calls == 0);
  arena->deallocate(again, 5 * Page);
  CHECK(arena->usage().mapped == 5 * Page);  // idle, kept for the next one
  arena->check_invariants();
}

TEST_CASE("a freed large block is kept whole for the next of its length, and goes back when room runs out") {
  auto arena = paged_arena();
  void* a = arena->allocate(12 * Page);
  arena->deallocate(a, 12 * Page);
  ArenaUsage u = arena->usage();
  CHECK(u.warm == 12 * Page);
  CHECK(u.reserved == 0);  // kept, not live: its pages count as free
  CHECK(u.free == 16 * Page);
  void* again = arena->allocate(12 * Page);
  CHECK(again == a);
  CHECK(arena->usage().warm == 0);
  CHECK(arena->usage().reserved == 12 * Page);
  arena->deallocate(again, 12 * Page);
  void* other = arena->allocate(8 * Page);  // four pages beside the kept block: it goes back
  CHECK(arena->usage().warm == 0);
  CHECK(arena->usage().reserved == 8 * Page);
  arena->deallocate(other, 8 * Page);
  arena->check_invariants();
}

TEST_CASE("a request of a page and a byte takes two whole pages, which it shares with nothing") {
  auto arena = paged_arena(16, true);
  void* small = arena->allocate(100 * KiB);  // under a page: its own pages may be shared
  void* large = arena->allocate(Page + 1);
  CHECK(reinterpret_cast<std::uintptr_t>(large) % Page == 0);
  arena->deallocate(large, Page + 1);
  ArenaUsage u = arena->usage();
  CHECK(u.warm == 2 * Page);  // kept: exactly its pages
  const std::size_t reserved = u.reserved;
  arena->release_cached();  // the kept block goes back: the pages the small block touches stay
  CHECK(arena->usage().reserved == reserved);
  arena->deallocate(small, 100 * KiB);
  arena->check_invariants();
}

TEST_CASE("idle pages are reused without a call, and unmapped when another range needs their memory") {
  auto arena = paged_arena();
  void* a = arena->allocate(16 * Page);
  arena->deallocate(a, 16 * Page);
  CHECK(arena->usage().unmap_calls == 0);
  void* small = arena->allocate(Page);  // inside a's idle run: reuses a mapped page
  CHECK(arena->usage().unmap_calls == 0);
  void* big = arena->allocate(15 * Page);  // the rest of the memory, at addresses a did not cover
  CHECK(arena->usage().unmap_calls >= 1);
  std::memset(big, 0x7F, 15 * Page);
  const ArenaUsage u = arena->usage();
  CHECK(u.reserved == 16 * Page);
  CHECK(u.physical_held <= 16 * Page);
  arena->deallocate(small, Page);
  arena->deallocate(big, 15 * Page);
  arena->check_invariants();
}

TEST_CASE("with an idle share, the pages held follow the pages in use, not every range ever touched") {
  // Blocks of 1-16 pages come and go at random ranges of a range four times the memory, at
  // most 12 live at once. Keeping every idle page until the memory runs out would hold all 256
  // pages; the pages held stay within an eighth (or four pages) over the most ever in use.
  constexpr std::uint32_t share = 8;
  detail::PageTable table(std::make_unique<ScriptedPages>(256, 1024, share));
  std::uint64_t state = 20261127;
  auto next = [&state](std::uint32_t below) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::uint32_t>((state >> 33) % below);
  };
  std::vector<std::pair<std::size_t, std::size_t>> live;  // offset, bytes
  std::uint32_t most_in_use = 0, acquires = 0;
  for (int step = 0; step < 20000; ++step) {
    if (live.size() >= 12 || (!live.empty() && next(2) == 0)) {
      const std::size_t victim = next(static_cast<std::uint32_t>(live.size()));
      table.release(live[victim].first, live[victim].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
      continue;
    }
    const std::size_t bytes = (1 + next(16)) * Page, offset = next(1024 - 16) * Page;
    if (table.acquire(offset, bytes) != detail::PageTable::Shortage::none) {
      CHECK(!"an acquire within the memory was refused");
      break;
    }
    ++acquires;
    live.emplace_back(offset, bytes);
    const detail::PageCounts c = table.counts();
    most_in_use = std::max(most_in_use, c.in_use);
    CHECK(c.held <= most_in_use + std::max(most_in_use / share, detail::PageTable::kIdleFloor));
  }
  table.check_invariants();
  const detail::PageCounts c = table.counts();
  CHECK(c.held < 256);
  // Once held pages stop growing, every page mapped was evicted first: an eviction unmaps a
  // share of pages in one call, several pages a call, not one.
  std::printf("acquires %u, unmap calls %llu, pages mapped %llu, held %u\n", acquires,
              static_cast<unsigned long long>(c.unmap_calls), static_cast<unsigned long long>(c.mapped_pages), c.held);
  CHECK(c.mapped_pages - c.held > 4 * c.unmap_calls);
  for (const auto& [offset, bytes] : live) table.release(offset, bytes);
  table.check_invariants();
}

TEST_CASE("an eviction refused part way keeps the refused pages idle, and the acquire goes on when it has pages") {
  auto owned = std::make_unique<ScriptedPages>(32, 128, 8);
  ScriptedPages& pages = *owned;
  detail::PageTable table(std::move(owned));
  // 20 pages in use, 8 idle after a release: held 28.
  CHECK(table.acquire(0, 20 * Page) == detail::PageTable::Shortage::none);
  CHECK(table.acquire(32 * Page, 8 * Page) == detail::PageTable::Shortage::none);
  table.release(32 * Page, 8 * Page);
  CHECK(table.counts().idle == 8 && table.counts().held == 28);
  // 4 fresh pages would hold 32 > 24 + 4: idle pages are evicted, and the third unmap is
  // refused. The two unmapped ones serve, with two pages never held: the acquire goes on.
  pages.refuse_unmap = pages.unmaps + 3;
  CHECK(table.acquire(64 * Page, 4 * Page) == detail::PageTable::Shortage::none);
  table.check_invariants();
  const detail::PageCounts c = table.counts();
  CHECK(c.in_use == 24 && c.idle == 6 && c.held == 30);
  // The refused page and those after it stayed idle and listed: a later eviction takes them.
  table.release(0, 20 * Page);
  table.release(64 * Page, 4 * Page);
  CHECK(table.trim() == 30);
  table.check_invariants();
  CHECK(table.counts().held == 0 && table.counts().free == 32);
}

TEST_CASE("release_cached unmaps idle pages and gives their memory back") {
  auto arena = paged_arena();
  void* a = arena->allocate(6 * Page);
  void* b = arena->allocate(2 * Page);
  arena->deallocate(a, 6 * Page);
  CHECK(arena->usage().physical_held == 8 * Page);
  arena->release_cached();
  const ArenaUsage u = arena->usage();
  CHECK(u.physical_held == 2 * Page);
  CHECK(u.mapped == 2 * Page);
  std::memset(b, 1, 2 * Page);  // the live block kept its pages
  arena->deallocate(b, 2 * Page);
  arena->check_invariants();
}

TEST_CASE("small blocks share pages, and a page goes idle with its last block") {
  auto arena = paged_arena(16, true);
  std::vector<void*> blocks;
  for (int i = 0; i < 200; ++i) blocks.push_back(arena->allocate(100 + i));
  CHECK(arena->usage().reserved <= 4 * Page);  // 200 slots of four size classes: a slab, one page, each
  for (std::size_t i = 0; i < blocks.size(); ++i) arena->deallocate(blocks[i], 100 + i);
  arena->release_cached();
  CHECK(arena->usage().reserved == 0);
  arena->check_invariants();
}

TEST_CASE("a refused map leaves the arena as it was, and the next allocation maps") {
  auto pages = std::make_unique<RefusingPages>(16 * Page);
  bool* refuse = pages->refuse();
  BuddyArena arena(std::move(pages), ArenaOptions{256, false, true});
  void* kept = arena.allocate(2 * Page);
  *refuse = true;
  bool refused = false;
  try {
    arena.allocate(4 * Page);
  } catch (const out_of_memory&) {
    refused = true;
  }
  CHECK(refused);
  arena.check_invariants();
  CHECK(arena.usage().reserved == 2 * Page);
  *refuse = false;
  void* mapped = arena.allocate(4 * Page);
  std::memset(mapped, 3, 4 * Page);
  arena.deallocate(mapped, 4 * Page);
  arena.deallocate(kept, 2 * Page);
  arena.check_invariants();
}

TEST_CASE("a refused unmap keeps its page mapped where it was: no physical page is mapped twice") {
  auto pages = std::make_unique<RefusingPages>(8 * Page);
  bool* refuse_unmap = pages->refuse_unmap();
  BuddyArena arena(std::move(pages), ArenaOptions{256, false, true});
  std::vector<void*> small;
  for (int i = 0; i < 8; ++i) small.push_back(arena.allocate(Page));
  for (int i = 0; i < 8; ++i) std::memset(small[i], i, Page);
  // Every other page freed: four idle pages, still mapped, and no room for four together.
  for (int i = 0; i < 8; i += 2) arena.deallocate(small[i], Page);
  *refuse_unmap = true;
  std::string message;
  try {
    arena.allocate(4 * Page);  // another range: it needs the idle pages unmapped first
  } catch (const out_of_memory& e) {
    message = e.what();
  }
  CHECK(contains(message, "the system refused to map or unmap its pages"));
  arena.check_invariants();
  for (int i = 1; i < 8; i += 2) CHECK(static_cast<unsigned char*>(small[i])[Page - 1] == i);  // live pages untouched
  *refuse_unmap = false;
  void* large = arena.allocate(4 * Page);
  std::memset(large, 9, 4 * Page);
  for (int i = 1; i < 8; i += 2) CHECK(static_cast<unsigned char*>(small[i])[0] == i);
  arena.deallocate(large, 4 * Page);
  for (int i = 1; i < 8; i += 2) arena.deallocate(small[i], Page);
  arena.check_invariants();
}

TEST_CASE("a map refused part way whose undoing is refused too leaves one idle page, listed once") {
  auto owned = std::make_unique<ScriptedPages>();
  ScriptedPages& pages = *owned;
  detail::PageTable table(std::move(owned));
  CHECK(table.acquire(0, 4 * Page) == detail::PageTable::Shortage::none);  // frames 0-3, one call
  table.release(1 * Page, Page);
  table.release(3 * Page, Page);
  CHECK(table.trim() == 2);   // frames 1 and 3 free again: the free list is no longer one run
  pages.refuse_map = pages.maps + 2;   // the second map call from now
  pages.refuse_unmaps = true;
  CHECK(table.acquire(8 * Page, 3 * Page) == detail::PageTable::Shortage::mapping);
  table.check_invariants();   // the page mapped by the first call keeps its frame, idle, once
  CHECK(table.counts().idle == 1 && table.counts().in_use == 2);
  pages.refuse_unmaps = false;
  CHECK(table.acquire(8 * Page, 3 * Page) == detail::PageTable::Shortage::none);
  table.check_invariants();
  CHECK(table.counts().in_use == 5 && table.counts().idle == 0);
  table.release(8 * Page, 3 * Page);
  table.release(0, Page);
  table.release(2 * Page, Page);
  table.trim();
  table.check_invariants();
  CHECK(table.counts().free == 8);
}

TEST_CASE("sizes past the capacity are refused with the capacity named") {
  auto arena = paged_arena();
  std::string message;
  try {
    arena->allocate(17 * Page);
  } catch (const out_of_memory& e) {
    message = e.what();
  }
  CHECK(contains(message, "1048576-byte capacity"));
  arena->check_invariants();
}

TEST_CASE("two paged arenas cannot both count on the same room below the process's mapping limit") {
  // A limit that holds the mappings the process has now, plus one arena of 16 pages at worst.
  std::size_t in_use = 0;
  if (std::FILE* maps = std::fopen("/proc/self/maps", "r")) {
    for (int c; (c = std::fgetc(maps)) != EOF;) in_use += c == '\n';
    std::fclose(maps);
  }
  const HostPagesOptions options{Page, 4, true, in_use + 2 * 16 + 1 + 8};
  auto first = std::make_unique<HostPages>(16 * Page, options);
  std::string message;
  try {
    HostPages second(16 * Page, options);
  } catch (const latte::bad_alloc& e) {
    message = e.what();
  }
  CHECK(contains(message, "33 promised to the process's other paged arenas"));
  first.reset();  // its promise goes with it
  HostPages again(16 * Page, options);
  CHECK(again.physical_pages() == 16);
}

TEST_CASE("threads hammering one paged arena never share a block, and evictions keep live pages") {
  const unsigned seed = latte::testing::stress_setting("LATTE_STRESS_SEED", 20261126);
  const int ops_per_thread = latte::testing::stress_setting("LATTE_STRESS_OPS", 4000);
  std::printf("paged stress seed %u, %d ops per thread\n", seed, ops_per_thread);
  auto arena = paged_arena(64, true);  // 4 MiB in pages of 64 KiB
  // Blocks of 8 B to 256 KiB: small ones share pages, large ones span several.
  const latte::testing::StressShape shape{48, 8, 512, 32768};
  const auto counts = latte::testing::stress_host_threads(*arena, 4, seed, ops_per_thread, shape);
  CHECK(counts.corrupted == 0);
  arena->check_invariants();
  CHECK(arena->usage().allocated == 0);
  CHECK(arena->usage().unmap_calls > 0);  // the run needed evictions: the case under test
  std::printf("out-of-memory refusals: %d, map calls %llu, unmap calls %llu\n", counts.refusals,
              static_cast<unsigned long long>(arena->usage().map_calls),
              static_cast<unsigned long long>(arena->usage().unmap_calls));
}

int main() { return latte::testing::run_all(); }
