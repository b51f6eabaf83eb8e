#pragma once
// Counts what passes through to the upstream: live (requested) bytes and their peak, counts
// of allocations, frees and failures, the request-size distribution, and the failures that
// happened with room to spare (the mark of fragmentation). Knows nothing of arenas; the
// arena's own occupancy is combined with these counters in arena_statistics.hpp.
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "latte/memory/detail/size_histogram.hpp"
#include "latte/memory/memory_resource.hpp"

namespace latte::memory {

// A failed request that would have left the upstream at most this share of its capacity in
// use found the bytes free but not in one piece: a fragmentation failure.
inline constexpr double kFragmentationFailureShare = 0.8;

struct AllocationCounters {
  std::size_t live = 0;  // bytes requested by live allocations
  std::size_t peak_live = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t failures = 0;
  std::uint64_t fragmentation_failures = 0;  // failures with live + request <= 80 % of capacity
  std::size_t p99_request = 0;               // bytes; 0 before the first request
};

class StatisticsAdaptor final : public MemoryResource {
 public:
  // capacity: the most the upstream can hand out (the arena's capacity, or its limit).
  StatisticsAdaptor(MemoryResource& upstream, std::size_t capacity)
      : upstream_(upstream), capacity_(capacity) {}

  AllocationCounters counters() const noexcept;

 private:
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* ptr, std::size_t bytes) noexcept override;
  // Lock-free counters: this sits on every allocation's path.
  MemoryResource& upstream_;
  const std::size_t capacity_;
  std::atomic<std::size_t> live_{0};
  std::atomic<std::size_t> peak_live_{0};
  std::atomic<std::uint64_t> allocations_{0};
  std::atomic<std::uint64_t> frees_{0};
  std::atomic<std::uint64_t> failures_{0};
  std::atomic<std::uint64_t> fragmentation_failures_{0};
  detail::SizeHistogram request_sizes_;
};

}  // namespace latte::memory
