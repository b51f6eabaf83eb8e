// Behaviour of the buddy arena and its adaptors, as a C++ user sees it.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "../check.hpp"
#include "latte/error.hpp"
#include "latte/memory/arena_statistics.hpp"
#include "latte/memory/buddy_arena.hpp"
#include "latte/memory/detail/size_classes.hpp"
#include "latte/memory/detail/size_histogram.hpp"
#include "latte/memory/host_resource.hpp"
#include "latte/memory/limiting_adaptor.hpp"
#include "latte/memory/statistics_adaptor.hpp"

using namespace latte::memory;
using latte::logic_error;
using latte::out_of_memory;

namespace {
constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
}  // namespace

TEST_CASE("large blocks are min_block aligned and coalesce back into one block") {
  HostResource host;
  BuddyArena arena(host, 4 * MiB);
  std::vector<void*> blocks;
  for (std::size_t bytes : {5000u, 70000u, 300000u, 8192u, 1048576u}) {
    void* p = arena.allocate(bytes);
    CHECK(addr(p) % 256 == 0);
    CHECK(arena.allocated_size(p) >= bytes);
    CHECK(arena.allocated_size(p) < bytes + 256);  // trimmed tail: waste below one unit
    std::memset(p, 0xAB, bytes);
    blocks.push_back(p);
  }
  arena.check_invariants();
  for (void* p : blocks) arena.deallocate(p, 0);
  arena.check_invariants();
  const ArenaUsage u = arena.usage();
  CHECK(u.reserved == 0);
  CHECK(u.largest_free == 4 * MiB);
}

TEST_CASE("without trimming a block is rounded to a power of two") {
  HostResource host;
  BuddyArena arena(host, 1 * MiB, ArenaOptions{256, false, false});
  void* p = arena.allocate(5000);
  CHECK(arena.allocated_size(p) == 8192);
  void* q = arena.allocate(100);
  CHECK(arena.allocated_size(q) == 256);
  arena.deallocate(p, 5000);
  arena.deallocate(q, 100);
  CHECK(arena.usage().largest_free == 1 * MiB);
}

TEST_CASE("small requests land in size classes with bounded rounding") {
  HostResource host;
  BuddyArena arena(host, 1 * MiB);
  for (std::size_t bytes = 1; bytes <= detail::SizeClassTable::kSmallLimit; bytes += 37) {
    void* p = arena.allocate(bytes);
    const std::size_t slot = arena.allocated_size(p);
    CHECK(addr(p) % detail::SizeClassTable::kAlignment == 0);
    CHECK(slot >= bytes);
    CHECK(bytes <= 512 ? slot - bytes < 64 : double(slot) / double(bytes) <= 1.25);
    arena.deallocate(p, bytes);
  }
  arena.check_invariants();
}

TEST_CASE("a capacity that is not a power of two is fully usable") {
  HostResource host;
  BuddyArena arena(host, 3 * MiB + 512 * KiB, ArenaOptions{4096, false, true});
  void* a = arena.allocate(2 * MiB);
  void* b = arena.allocate(1 * MiB);
  void* c = arena.allocate(512 * KiB);
  CHECK(arena.usage().free == 0);
  CHECK_THROWS_AS(arena.allocate(4096), out_of_memory);
  arena.deallocate(b, 0);
  arena.deallocate(a, 0);
  arena.deallocate(c, 0);
  arena.check_invariants();
  CHECK(arena.usage().free == 3 * MiB + 512 * KiB);
}

TEST_CASE("out of memory throws with the sizes in the message") {
  HostResource host;
  BuddyArena arena(host, 1 * MiB);
  void* p = arena.allocate(768 * KiB);
  bool caught = false;
  try {
    arena.allocate(512 * KiB);
  } catch (const out_of_memory& e) {
    caught = true;
    const std::string message = e.what();
    CHECK(message.find("524288") != std::string::npos);
    CHECK(message.find("capacity 1048576") != std::string::npos);
  }
  CHECK(caught);
  arena.deallocate(p, 768 * KiB);
  void* q = arena.allocate(1 * MiB);
  arena.deallocate(q, 1 * MiB);
}

TEST_CASE("bad arguments are rejected with logic_error") {
  HostResource host;
  CHECK_THROWS_AS(BuddyArena(host, 100), logic_error);
  CHECK_THROWS_AS(BuddyArena(host, 1 * MiB, ArenaOptions{300, true, true}), logic_error);
  BuddyArena arena(host, 1 * MiB);
  CHECK(arena.allocate(0) == nullptr);
  arena.deallocate(nullptr, 0);
}

TEST_CASE("statistics adaptor reports live, rounded, peak and fragmentation") {
  HostResource host;
  BuddyArena arena(host, 1 * MiB);
  StatisticsAdaptor stats(arena, arena.capacity());
  void* a = stats.allocate(100 * KiB + 1);
  void* b = stats.allocate(1000);
  Statistics s = arena_statistics(arena.usage(), stats.counters());
  CHECK(s.capacity == 1 * MiB);
  CHECK(s.live == 100 * KiB + 1 + 1000);
  CHECK(s.allocated == 100 * KiB + 256 + 1024);
  CHECK(s.reserved == 100 * KiB + 256 + detail::SizeClassTable::kSlabBytes);
  CHECK(s.internal_fragmentation > 0.0 && s.internal_fragmentation < 0.01);
  CHECK(s.external_fragmentation > 0.0);  // the free space is split around the two blocks
  CHECK_THROWS_AS(stats.allocate(2 * MiB), out_of_memory);
  stats.deallocate(a, 100 * KiB + 1);
  stats.deallocate(b, 1000);
  s = arena_statistics(arena.usage(), stats.counters());
  CHECK(s.live == 0);
  CHECK(s.peak_live == 100 * KiB + 1 + 1000);
  CHECK(s.peak_reserved >= s.peak_allocated);
  CHECK(s.allocations == 2 && s.frees == 2 && s.failures == 1);
  CHECK(s.fragmentation_failures == 0);  // 2 MiB could never fit: that is not fragmentation
}

TEST_CASE("the request-size percentile is never below the true size and at most 1/8 above") {
  detail::SizeHistogram histogram;
  CHECK(histogram.percentile(0.99) == 0);
  for (std::size_t bytes : {1u, 15u, 16u, 17u, 1000u, 4096u, 100000u, 1u << 30}) {
    const std::size_t edge = detail::SizeHistogram::upper_edge(detail::SizeHistogram::bucket_of(bytes));
    CHECK(edge >= bytes);
    CHECK(edge <= bytes + bytes / 8);
  }
  for (int i = 0; i < 99; ++i) histogram.record(4096);
  histogram.record(1 * MiB);
  CHECK(histogram.percentile(0.99) >= 4096 && histogram.percentile(0.99) < 4096 + 512);
  histogram.record(1 * MiB);
  CHECK(histogram.percentile(0.99) >= 1 * MiB);
}

TEST_CASE("a healthy arena does not alarm, though 1 - largest/free reads about one half") {
  HostResource host;
  BuddyArena arena(host, 1 * MiB, ArenaOptions{256, false, true});
  StatisticsAdaptor stats(arena, arena.capacity());
  void* p = stats.allocate(64 * KiB);
  const Statistics s = arena_statistics(arena.usage(), stats.counters());
  CHECK(s.external_fragmentation > 0.45);  // why that figure cannot alarm
  CHECK(s.p99_request >= 64 * KiB && s.largest_free >= s.p99_request);
  CHECK(!s.fragmented);
  CHECK(s.fragmentation_failures == 0);
  stats.deallocate(p, 64 * KiB);
}

TEST_CASE("a fragmented arena alarms: the P99 request no longer fits though the bytes are free") {
  HostResource host;
  BuddyArena arena(host, 1 * MiB, ArenaOptions{256, false, true});
  StatisticsAdaptor stats(arena, arena.capacity());
  std::vector<void*> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(stats.allocate(64 * KiB));
  for (int i = 0; i < 16; i += 2) stats.deallocate(blocks[i], 64 * KiB);  // every other one
  CHECK_THROWS_AS(stats.allocate(128 * KiB), out_of_memory);  // 512 KiB free, in 64 KiB pieces
  const Statistics s = arena_statistics(arena.usage(), stats.counters());
  CHECK(s.free == 512 * KiB && s.largest_free == 64 * KiB);
  CHECK(s.p99_request >= 128 * KiB);
  CHECK(s.fragmented);
  CHECK(s.failures == 1 && s.fragmentation_failures == 1);  // live + request = 62.5 % of capacity
  for (int i = 1; i < 16; i += 2) stats.deallocate(blocks[i], 64 * KiB);
  CHECK(!arena_statistics(arena.usage(), stats.counters()).fragmented);
}

TEST_CASE("limiting adaptor forces out of memory below the arena's capacity") {
  HostResource host;
  BuddyArena arena(host, 4 * MiB);
  LimitingAdaptor limited(arena, 1 * MiB);
  void* a = limited.allocate(600 * KiB);
  CHECK_THROWS_AS(limited.allocate(600 * KiB), out_of_memory);
  CHECK(limited.used() == 600 * KiB);
  limited.deallocate(a, 600 * KiB);
  void* b = limited.allocate(1 * MiB);
  limited.deallocate(b, 1 * MiB);
  CHECK(limited.used() == 0);
}

TEST_CASE("host resource hands out zeroed, writable, page-aligned memory") {
  HostResource host;
  auto* p = static_cast<unsigned char*>(host.allocate(3 * 4096 + 1));
  CHECK(addr(p) % 4096 == 0);
  CHECK(p[0] == 0 && p[3 * 4096] == 0);
  p[3 * 4096] = 7;
  CHECK(host.is_pinned(p) == HostResource::cuda_runtime_available());
  host.deallocate(p, 3 * 4096 + 1);
}

TEST_CASE("random sequences keep invariants and never overlap live blocks") {
  HostResource host;
  BuddyArena arena(host, 2 * MiB);
  std::mt19937_64 rng(12345);
  std::map<std::uintptr_t, std::size_t> live;  // address -> allocated size
  std::size_t failures = 0;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const std::size_t bytes = 1 + rng() % (rng() % 2 ? 4096 : 200000);
      try {
        void* p = arena.allocate(bytes);
        const std::size_t size = arena.allocated_size(p);
        auto next = live.lower_bound(addr(p));
        CHECK(next == live.end() || addr(p) + size <= next->first);
        if (next != live.begin()) {
          auto prev = std::prev(next);
          CHECK(prev->first + prev->second <= addr(p));
        }
        live[addr(p)] = size;
      } catch (const out_of_memory&) {
        ++failures;
      }
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      arena.deallocate(reinterpret_cast<void*>(it->first), 0);
      live.erase(it);
    }
    if (step % 97 == 0) arena.check_invariants();
  }
  for (auto& [p, size] : live) arena.deallocate(reinterpret_cast<void*>(p), size);
  arena.check_invariants();
  CHECK(arena.usage().allocated == 0);
  arena.release_cached();
  CHECK(arena.usage().reserved == 0);
  CHECK(arena.usage().largest_free == 2 * MiB);
  CHECK(failures < 4000);
}

int main() { return latte::testing::run_all(); }
