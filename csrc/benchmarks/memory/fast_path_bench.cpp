// Nanoseconds per allocate/free pair on the small (size-class) path, against malloc/free
// measured in the same run; a warm large pair on the plain and the paged arena; what mapping
// costs a paged arena cold, per MiB. Prints JSON.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "latte/memory/buddy_arena.hpp"
#include "latte/memory/host_pages.hpp"
#include "latte/memory/host_resource.hpp"

using namespace latte::memory;

namespace {

template <typename Body>
double ns_per_pair(std::size_t pairs, Body body) {
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    body(pairs);
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, ns / double(pairs));
  }
  return best;
}

// A warm pair of one large size, the pair a serving loop repeats, on the plain buddy and on
// the paged arena (whose freed pages stay mapped); then the paged arena cold: every map after
// its memory went back to the system (release_cached), pages faulted in as they are mapped.
void large_blocks() {
  constexpr std::size_t MiB = 1 << 20, kLargePairs = 200'000;
  HostResource host;
  BuddyArena plain(host, 256 * MiB);
  BuddyArena paged(std::make_unique<HostPages>(256 * MiB, HostPagesOptions{1 * MiB, 4, true}));
  volatile std::uintptr_t sink = 0;
  std::printf("  ,\"large_pairs\": {");
  const std::size_t sizes[] = {1 * MiB, 8 * MiB, 64 * MiB};
  for (std::size_t i = 0; i < 3; ++i) {
    const std::size_t bytes = sizes[i];
    auto pairs_on = [&](BuddyArena& arena) {
      return ns_per_pair(kLargePairs, [&](std::size_t n) {
        for (std::size_t k = 0; k < n; ++k) {
          void* p = arena.allocate(bytes);
          sink = sink + reinterpret_cast<std::uintptr_t>(p);
          arena.deallocate(p, bytes);
        }
      });
    };
    const double buddy_ns = pairs_on(plain), paged_ns = pairs_on(paged);
    std::printf("%s\"%zu\": {\"buddy_ns\": %.1f, \"paged_ns\": %.1f}", i ? ", " : "", bytes, buddy_ns, paged_ns);
  }
  std::vector<double> per_mib;
  for (int round = 0; round < 15; ++round) {
    paged.release_cached();
    const auto start = std::chrono::steady_clock::now();
    void* p = paged.allocate(64 * MiB);
    per_mib.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / 64);
    paged.deallocate(p, 64 * MiB);
  }
  std::sort(per_mib.begin(), per_mib.end());
  std::printf("},\n  \"cold_map_ns_per_mib\": %.0f\n", per_mib[per_mib.size() / 2]);
}

}  // namespace

int main() {
  HostResource host;
  BuddyArena arena(host, 64 << 20);
  const std::size_t sizes[] = {64, 200, 512, 1000, 2048, 4000};
  constexpr std::size_t kPairs = 2'000'000;
  volatile std::uintptr_t sink = 0;
  std::printf("{\n");
  for (std::size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    const std::size_t bytes = sizes[i];
    const double arena_ns = ns_per_pair(kPairs, [&](std::size_t n) {
      for (std::size_t k = 0; k < n; ++k) {
        void* p = arena.allocate(bytes);
        sink = sink + reinterpret_cast<std::uintptr_t>(p);
        arena.deallocate(p, bytes);
      }
    });
    const double malloc_ns = ns_per_pair(kPairs, [&](std::size_t n) {
      for (std::size_t k = 0; k < n; ++k) {
        void* p = std::malloc(bytes);
        sink = sink + reinterpret_cast<std::uintptr_t>(p);
        std::free(p);
      }
    });
    std::printf("  \"%zu\": {\"arena_ns\": %.1f, \"malloc_ns\": %.1f}%s\n", bytes, arena_ns, malloc_ns,
                i + 1 < sizeof sizes / sizeof sizes[0] ? "," : "");
  }
  // A window of 64 live blocks of mixed small sizes: slabs fill and drain, not one slot reused.
  std::vector<void*> window(64, nullptr);
  const double mixed_ns = ns_per_pair(kPairs, [&](std::size_t n) {
    for (std::size_t k = 0; k < n; ++k) {
      void*& slot = window[k % 64];
      arena.deallocate(slot, 0);
      slot = arena.allocate(64 + (k * 2654435761u) % 4000);
    }
  });
  for (void*& p : window) arena.deallocate(p, 0);
  std::printf("  ,\"mixed_window\": {\"arena_ns\": %.1f}\n", mixed_ns);
  large_blocks();
  std::printf("}\n");
  return 0;
}
