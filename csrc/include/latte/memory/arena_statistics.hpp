#pragma once
// One report on an arena: its occupancy (from the BuddyArena) with the counters of the
// StatisticsAdaptor in front of it, and the figures derived from both.
#include <cstddef>
#include <cstdint>

#include "latte/memory/buddy_arena.hpp"
#include "latte/memory/statistics_adaptor.hpp"

namespace latte::memory {

struct Statistics {
  std::size_t capacity = 0;
  std::size_t reserved = 0;
  std::size_t live = 0;        // bytes requested by live allocations
  std::size_t allocated = 0;   // bytes of live allocations after rounding
  std::size_t free = 0;
  std::size_t largest_free = 0;  // the largest request the arena can still serve
  std::size_t peak_reserved = 0;
  std::size_t peak_live = 0;
  std::size_t peak_allocated = 0;
  double internal_fragmentation = 0.0;  // 1 - live / allocated: rounding waste
  // 1 - largest_free / free: free space in pieces. Descriptive only: a buddy arena reads about
  // 0.5 with a single block live, so it cannot tell a healthy arena from a fragmented one.
  double external_fragmentation = 0.0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t failures = 0;
  // The figures that can alarm: the P99 request seen, whether the largest free block still
  // holds it although the free bytes would, and failures that had room to spare.
  std::size_t p99_request = 0;
  std::uint64_t fragmentation_failures = 0;
  bool fragmented = false;  // free >= p99_request > largest_free
  // Paged arenas (page_bytes 0 otherwise): see ArenaUsage.
  std::size_t page_bytes = 0;
  std::size_t address_range = 0;
  std::size_t mapped = 0;
  std::size_t physical_held = 0;
  std::uint64_t map_calls = 0;
  std::uint64_t unmap_calls = 0;
  std::size_t mapped_total = 0;
  std::size_t warm = 0;
};

Statistics arena_statistics(const ArenaUsage& usage, const AllocationCounters& counters) noexcept;

}  // namespace latte::memory
