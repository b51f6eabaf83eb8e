#include "latte/memory/statistics_adaptor.hpp"

#include <new>

namespace latte::memory {

void* StatisticsAdaptor::do_allocate(std::size_t bytes) {
  request_sizes_.record(bytes);
  void* ptr = nullptr;
  try {
    ptr = upstream_.allocate(bytes);
  } catch (const std::bad_alloc&) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    const double after = static_cast<double>(live_.load(std::memory_order_relaxed)) + static_cast<double>(bytes);
    if (after <= kFragmentationFailureShare * static_cast<double>(capacity_)) {
      fragmentation_failures_.fetch_add(1, std::memory_order_relaxed);
    }
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

AllocationCounters StatisticsAdaptor::counters() const noexcept {
  AllocationCounters c;
  c.live = live_.load(std::memory_order_relaxed);
  c.peak_live = peak_live_.load(std::memory_order_relaxed);
  c.allocations = allocations_.load(std::memory_order_relaxed);
  c.frees = frees_.load(std::memory_order_relaxed);
  c.failures = failures_.load(std::memory_order_relaxed);
  c.fragmentation_failures = fragmentation_failures_.load(std::memory_order_relaxed);
  c.p99_request = request_sizes_.percentile(0.99);
  return c;
}

}  // namespace latte::memory
