#pragma once
// One thread's part of an arena stress test, shared by the host and the device tests: allocate
// blocks of mixed sizes and stamp them, free a random live block after checking its stamp, and
// at the end check and free the rest. What a stamp is (words written in host memory, or words
// copied to the device) is the caller's.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "latte/error.hpp"
#include "latte/memory/buddy_arena.hpp"

namespace latte::testing {

struct StressBlock {
  void* ptr;
  std::size_t bytes;
  std::uint64_t stamp;
};

struct StressShape {
  std::size_t max_live;       // blocks one thread holds at most
  std::size_t unit;           // every size is a multiple of this
  std::uint64_t small_units;  // three sizes in four: up to this many units
  std::uint64_t large_units;  // one in four: up to this many
};

struct StressCounts {
  int corrupted = 0;  // stamps found overwritten: two live blocks overlapped
  int refusals = 0;   // out-of-memory answers (the arena is meant to run full at times)
};

// A host block's stamp: three of its words, the first, the middle and the last.
inline void stamp_host(const StressBlock& b) {
  auto* words = static_cast<std::uint64_t*>(b.ptr);
  const std::size_t count = b.bytes / 8;
  words[0] = words[count / 2] = words[count - 1] = b.stamp;
}

inline bool host_stamp_intact(const StressBlock& b) {
  const auto* words = static_cast<const std::uint64_t*>(b.ptr);
  const std::size_t count = b.bytes / 8;
  return words[0] == b.stamp && words[count / 2] == b.stamp && words[count - 1] == b.stamp;
}

template <class Stamp, class Intact>
StressCounts stress_thread(latte::memory::BuddyArena& arena, std::uint64_t seed, std::uint64_t thread, int ops,
                           const StressShape& shape, Stamp stamp, Intact intact) {
  std::mt19937_64 rng(seed);
  std::vector<StressBlock> live;
  StressCounts counts;
  for (int op = 0; op < ops; ++op) {
    if (live.size() < shape.max_live && (live.empty() || rng() % 2 == 0)) {
      const std::uint64_t range = rng() % 4 == 0 ? shape.large_units : shape.small_units;
      const std::size_t bytes = shape.unit * (1 + rng() % range);
      try {
        const StressBlock block{arena.allocate(bytes), bytes, (thread << 48) | std::uint64_t(op)};
        stamp(block);
        live.push_back(block);
      } catch (const latte::out_of_memory&) {
        ++counts.refusals;
      }
    } else {
      const std::size_t i = rng() % live.size();
      if (!intact(live[i])) ++counts.corrupted;
      arena.deallocate(live[i].ptr, live[i].bytes);
      live[i] = live.back();
      live.pop_back();
    }
  }
  for (const StressBlock& block : live) {
    if (!intact(block)) ++counts.corrupted;
    arena.deallocate(block.ptr, block.bytes);
  }
  return counts;
}

// A setting of the stress tests from the environment (LATTE_STRESS_SEED, LATTE_STRESS_OPS), else
// `fallback`.
inline int stress_setting(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : fallback;
}

// `threads` threads running stress_thread on one arena at once, thread t seeded with seed + t and
// stamping with the id first_id + t, each calling `start` first; their counts added up.
template <class Stamp, class Intact, class Start>
StressCounts stress_threads(latte::memory::BuddyArena& arena, unsigned threads, std::uint64_t seed,
                            std::uint64_t first_id, int ops, const StressShape& shape, Stamp stamp, Intact intact,
                            Start start) {
  std::atomic<int> corrupted{0}, refusals{0};
  std::vector<std::thread> running;
  for (unsigned t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      start();
      const StressCounts counts = stress_thread(arena, seed + t, first_id + t, ops, shape, stamp, intact);
      corrupted.fetch_add(counts.corrupted);
      refusals.fetch_add(counts.refusals);
    });
  }
  for (std::thread& thread : running) thread.join();
  return StressCounts{corrupted.load(), refusals.load()};
}

// The same on host memory, stamped with stamp_host.
inline StressCounts stress_host_threads(latte::memory::BuddyArena& arena, unsigned threads, std::uint64_t seed,
                                        int ops, const StressShape& shape) {
  return stress_threads(arena, threads, seed, 0, ops, shape, stamp_host, host_stamp_intact, [] {});
}

}  // namespace latte::testing
