#include "latte/memory/statistics_adaptor.hpp"

#include <algorithm>

#include "latte/memory/error.hpp"

namespace latte::memory {

void StatisticsAdaptor::record_peaks_locked() {
  counters_.peak_live = std::max(counters_.peak_live, counters_.live);
  if (auto u = upstream_.usage()) {
    counters_.peak_reserved = std::max(counters_.peak_reserved, u->reserved);
    counters_.peak_allocated = std::max(counters_.peak_allocated, u->allocated);
  }
}

void* StatisticsAdaptor::do_allocate(std::size_t bytes) {
  void* ptr = nullptr;
  try {
    ptr = upstream_.allocate(bytes);
  } catch (const std::bad_alloc&) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.failures;
    throw;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.allocations;
  counters_.live += bytes;
  record_peaks_locked();
  return ptr;
}

void StatisticsAdaptor::do_deallocate(void* ptr, std::size_t bytes) noexcept {
  upstream_.deallocate(ptr, bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.frees;
  counters_.live -= bytes;
}

Statistics StatisticsAdaptor::statistics() const {
  Statistics s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    s = counters_;
  }
  if (auto u = upstream_.usage()) {
    s.capacity = u->capacity;
    s.reserved = u->reserved;
    s.allocated = u->allocated;
    s.free = u->free;
    s.largest_free = u->largest_free;
  } else {
    s.allocated = s.live;
  }
  s.internal_fragmentation = s.allocated == 0 ? 0.0 : 1.0 - double(s.live) / double(s.allocated);
  s.external_fragmentation = s.free == 0 ? 0.0 : 1.0 - double(s.largest_free) / double(s.free);
  return s;
}

}  // namespace latte::memory
