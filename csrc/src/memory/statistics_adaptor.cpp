#include "latte/memory/statistics_adaptor.hpp"

#include <new>

namespace latte::memory {

void* StatisticsAdaptor::do_allocate(std::size_t bytes) {
  void* ptr = nullptr;
  try {
    ptr = upstream_.allocate(bytes);
  } catch (const std::bad_alloc&) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    throw;
  }
  allocations_.fetch_add(1, std::memory_order_relaxed);
  const std::size_t live = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  std::size_t peak = peak_live_.load(std::memory_order_relaxed);
  while (live > peak && !peak_live_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
  return ptr;
}

void StatisticsAdaptor::do_deallocate(void* ptr, std::size_t bytes) noexcept {
  upstream_.deallocate(ptr, bytes);
  frees_.fetch_add(1, std::memory_order_relaxed);
  live_.fetch_sub(bytes, std::memory_order_relaxed);
}

Statistics StatisticsAdaptor::statistics() const {
  Statistics s;
  s.live = live_.load(std::memory_order_relaxed);
  s.peak_live = peak_live_.load(std::memory_order_relaxed);
  s.allocations = allocations_.load(std::memory_order_relaxed);
  s.frees = frees_.load(std::memory_order_relaxed);
  s.failures = failures_.load(std::memory_order_relaxed);
  if (auto u = upstream_.usage()) {
    s.capacity = u->capacity;
    s.reserved = u->reserved;
    s.allocated = u->allocated;
    s.free = u->free;
    s.largest_free = u->largest_free;
    s.peak_reserved = u->peak_reserved;
    s.peak_allocated = u->peak_allocated;
  } else {
    s.allocated = s.live;
    s.peak_allocated = s.peak_live;
  }
  s.internal_fragmentation = s.allocated == 0 ? 0.0 : 1.0 - double(s.live) / double(s.allocated);
  s.external_fragmentation = s.free == 0 ? 0.0 : 1.0 - double(s.largest_free) / double(s.free);
  return s;
}

}  // namespace latte::memory
