#pragma once
// Implementation detail of StatisticsAdaptor: the distribution of request sizes, lock-free,
// so the arena's fit for its typical large request can be judged without a trace.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace latte::memory::detail {

// Sizes below 16 are counted exactly; above, each doubling is split into 8 buckets, so a
// percentile read back is at most 12.5 % above the true size and never below it.
class SizeHistogram {
 public:
  static constexpr std::size_t kBuckets = 16 + 60 * 8;

  void record(std::size_t bytes) noexcept;
  // The smallest size that at least `share` (0..1] of the recorded requests do not exceed,
  // as the upper edge of its bucket; 0 when nothing was recorded.
  std::size_t percentile(double share) const noexcept;

  static std::size_t bucket_of(std::size_t bytes) noexcept;
  static std::size_t upper_edge(std::size_t bucket) noexcept;

 private:
  std::array<std::atomic<std::uint64_t>, kBuckets> counts_{};
};

}  // namespace latte::memory::detail
