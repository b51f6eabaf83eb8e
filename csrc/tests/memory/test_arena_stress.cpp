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
  const unsigned seed = latte::testing::stress_setting("LATTE_STRESS_SEED", 20261121);
  const int ops_per_thread = latte::testing::stress_setting("LATTE_STRESS_OPS", 5000);
  std::printf("stress seed %u, %d ops per thread\n", seed, ops_per_thread);
  HostResource host;
  BuddyArena arena(host, 4 * 1024 * 1024);
  // Blocks of 8 B to 128 KiB, mostly under 4 KiB.
  const latte::testing::StressShape shape{64, 8, 512, 16384};
  const auto counts = latte::testing::stress_host_threads(arena, 4, seed, ops_per_thread, shape);
  CHECK(counts.corrupted == 0);
  arena.check_invariants();
  CHECK(arena.usage().allocated == 0);
  std::printf("out-of-memory refusals: %d\n", counts.refusals);
}

int main() { return latte::testing::run_all(); }
