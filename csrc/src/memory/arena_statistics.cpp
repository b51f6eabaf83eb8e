#include "latte/memory/arena_statistics.hpp"

namespace latte::memory {

Statistics arena_statistics(const ArenaUsage& usage, const AllocationCounters& counters) noexcept {
  Statistics s;
  s.capacity = usage.capacity;
  s.reserved = usage.reserved;
  s.allocated = usage.allocated;
  s.free = usage.free;
  s.largest_free = usage.largest_free;
  s.peak_reserved = usage.peak_reserved;
  s.peak_allocated = usage.peak_allocated;
  s.page_bytes = usage.page_bytes;
  s.address_range = usage.address_range;
  s.mapped = usage.mapped;
  s.physical_held = usage.physical_held;
  s.map_calls = usage.map_calls;
  s.unmap_calls = usage.unmap_calls;
  s.mapped_total = usage.mapped_total;
  s.warm = usage.warm;
  s.live = counters.live;
  s.peak_live = counters.peak_live;
  s.allocations = counters.allocations;
  s.frees = counters.frees;
  s.failures = counters.failures;
  s.p99_request = counters.p99_request;
  s.fragmentation_failures = counters.fragmentation_failures;
  s.internal_fragmentation = s.allocated == 0 ? 0.0 : 1.0 - double(s.live) / double(s.allocated);
  s.external_fragmentation = s.free == 0 ? 0.0 : 1.0 - double(s.largest_free) / double(s.free);
  // A full arena is not a fragmented one: the alarm needs the free bytes to be there.
  s.fragmented = s.p99_request > 0 && s.largest_free < s.p99_request && s.free >= s.p99_request;
  return s;
}

}  // namespace latte::memory
