#pragma once
// Counts what passes through to the upstream and combines it with the upstream arena's
// occupancy: live (requested) vs allocated (rounded) vs reserved bytes, peaks, fragmentation.
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "latte/memory/memory_resource.hpp"

namespace latte::memory {

struct Statistics {
  std::size_t capacity = 0;
  std::size_t reserved = 0;
  std::size_t live = 0;        // bytes requested by live allocations
  std::size_t allocated = 0;   // bytes of live allocations after rounding
  std::size_t free = 0;
  std::size_t largest_free = 0;
  std::size_t peak_reserved = 0;
  std::size_t peak_live = 0;
  std::size_t peak_allocated = 0;
  double internal_fragmentation = 0.0;  // 1 - live / allocated: rounding waste
  double external_fragmentation = 0.0;  // 1 - largest_free / free: free space in pieces
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t failures = 0;
};

class StatisticsAdaptor final : public MemoryResource {
 public:
  explicit StatisticsAdaptor(MemoryResource& upstream) : upstream_(upstream) {}

  Statistics statistics() const;
  std::optional<ArenaUsage> usage() const override { return upstream_.usage(); }

 private:
  void* do_allocate(std::size_t bytes) override;
  void do_deallocate(void* ptr, std::size_t bytes) noexcept override;
  void record_peaks_locked();

  MemoryResource& upstream_;
  mutable std::mutex mutex_;
  Statistics counters_;  // live/peaks/counts; occupancy is read from the upstream on demand
};

}  // namespace latte::memory
