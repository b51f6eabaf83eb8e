// Seeded multi-threaded stress: threads allocate, stamp, verify and free blocks of mixed sizes.
// A stamp overwritten by another thread means two live blocks overlapped.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "check.hpp"
#include "latte/memory/buddy_arena.hpp"
#include "latte/error.hpp"
#include "latte/memory/host_resource.hpp"

using namespace latte::memory;
using latte::logic_error;
using latte::out_of_memory;

namespace {

struct Live {
  std::uint64_t* ptr;
  std::size_t bytes;
  std::uint64_t stamp;
};

void stamp(const Live& b) {
  const std::size_t words = b.bytes / 8;
  b.ptr[0] = b.stamp;
  b.ptr[words - 1] = b.stamp;
  b.ptr[words / 2] = b.stamp;
}

bool stamp_intact(const Live& b) {
  const std::size_t words = b.bytes / 8;
  return b.ptr[0] == b.stamp && b.ptr[words - 1] == b.stamp && b.ptr[words / 2] == b.stamp;
}

}  // namespace

TEST_CASE("threads hammering one arena never share a block") {
  const unsigned seed = std::getenv("LATTE_STRESS_SEED") ? std::atoi(std::getenv("LATTE_STRESS_SEED")) : 20261121;
  const int ops_per_thread = std::getenv("LATTE_STRESS_OPS") ? std::atoi(std::getenv("LATTE_STRESS_OPS")) : 5000;
  std::printf("stress seed %u, %d ops per thread\n", seed, ops_per_thread);
  HostResource host;
  BuddyArena arena(host, 4 * 1024 * 1024);
  std::atomic<int> corrupted{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + t);
      std::vector<Live> live;
      for (int op = 0; op < ops_per_thread; ++op) {
        if (live.size() < 64 && (live.empty() || rng() % 2 == 0)) {
          const std::size_t bytes = 8 * (1 + rng() % (rng() % 4 == 0 ? 16384 : 512));
          try {
            Live b{static_cast<std::uint64_t*>(arena.allocate(bytes)), bytes,
                   (std::uint64_t(t) << 48) | std::uint64_t(op)};
            stamp(b);
            live.push_back(b);
          } catch (const out_of_memory&) {
            failures.fetch_add(1);
          }
        } else {
          const std::size_t i = rng() % live.size();
          if (!stamp_intact(live[i])) corrupted.fetch_add(1);
          arena.deallocate(live[i].ptr, live[i].bytes);
          live[i] = live.back();
          live.pop_back();
        }
      }
      for (const Live& b : live) {
        if (!stamp_intact(b)) corrupted.fetch_add(1);
        arena.deallocate(b.ptr, b.bytes);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(corrupted.load() == 0);
  arena.check_invariants();
  CHECK(arena.usage().allocated == 0);
  std::printf("out-of-memory refusals: %d\n", failures.load());
}

int main() { return latte::testing::run_all(); }
