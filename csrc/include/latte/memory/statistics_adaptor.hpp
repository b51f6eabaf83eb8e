#pragma once
// Counts what passes through to the upstream and combines it with the upstream arena's
// occupancy: live (requested) vs allocated (rounded) vs reserved bytes, peaks, fragmentation.
#include <atomic>
#include <cstddef>
#include <cstdint>

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
  // Lock-free counters: this sits on every allocation's path. Occupancy and its peaks are
  // read from the upstream on demand.
  MemoryResource& upstream_;
  std::atomic<std::size_t> live_{0};
  std::atomic<std::size_t> peak_live_{0};
  std::atomic<std::uint64_t> allocations_{0};
  std::atomic<std::uint64_t> frees_{0};
  std::atomic<std::uint64_t> failures_{0};
};

}  // namespace latte::memory
