// Seeded multi-threaded stress: threads allocate, stamp, verify and free blocks of mixed sizes.
// A stamp overwritten by another thread means two live blocks overlapped.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../check.hpp"
#include "stress_loop.hpp"
#include "latte/memory/buddy_arena.hpp"
#include "latte/error.hpp"
#include "latte/memory/host_resource.hpp"

using namespace latte::memory;

TEST_CASE("threads hammering one arena never share a block") {
  const unsigned seed = std::getenv("LATTE_STRESS_SEED") ? std::atoi(std::getenv("LATTE_STRESS_SEED")) : 20261121;
  const int ops_per_thread = std::getenv("LATTE_STRESS_OPS") ? std::atoi(std::getenv("LATTE_STRESS_OPS")) : 5000;
  std::printf("stress seed %u, %d ops per thread\n", seed, ops_per_thread);
  HostResource host;
  BuddyArena arena(host, 4 * 1024 * 1024);
  // Blocks of 8 B to 128 KiB, mostly under 4 KiB.
  const latte::testing::StressShape shape{64, 8, 512, 16384};
  std::atomic<int> corrupted{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const auto counts = latte::testing::stress_thread(arena, seed + t, t, ops_per_thread, shape,
                                                        latte::testing::stamp_host,
                                                        latte::testing::host_stamp_intact);
      corrupted.fetch_add(counts.corrupted);
      failures.fetch_add(counts.refusals);
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(corrupted.load() == 0);
  arena.check_invariants();
  CHECK(arena.usage().allocated == 0);
  std::printf("out-of-memory refusals: %d\n", failures.load());
}

int main() { return latte::testing::run_all(); }
