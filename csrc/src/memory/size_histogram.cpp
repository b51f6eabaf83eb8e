#include "latte/memory/detail/size_histogram.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace latte::memory::detail {

std::size_t SizeHistogram::bucket_of(std::size_t bytes) noexcept {
  if (bytes < 16) return bytes;
  const unsigned e = 63u - static_cast<unsigned>(__builtin_clzll(bytes));  // >= 4
  const std::size_t sub = (bytes >> (e - 3)) & 7u;
  return 16 + (e - 4) * 8 + sub;
}

std::size_t SizeHistogram::upper_edge(std::size_t bucket) noexcept {
  if (bucket < 16) return bucket;
  const unsigned e = static_cast<unsigned>((bucket - 16) / 8) + 4;
  const std::size_t sub = (bucket - 16) % 8;
  const std::size_t lower = (8 + sub) << (e - 3);
  return lower + ((std::size_t{1} << (e - 3)) - 1);
}

void SizeHistogram::record(std::size_t bytes) noexcept {
  counts_[bucket_of(bytes)].fetch_add(1, std::memory_order_relaxed);
}

std::size_t SizeHistogram::percentile(double share) const noexcept {
  std::array<std::uint64_t, kBuckets> snapshot;
  std::uint64_t total = 0;
  for (std::size_t b = 0; b < kBuckets; ++b) {
    snapshot[b] = counts_[b].load(std::memory_order_relaxed);
    total += snapshot[b];
  }
  if (total == 0) return 0;
  // The epsilon keeps 0.99 * 100 from rounding up to rank 100.
  const auto rank = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::ceil(share * static_cast<double>(total) - 1e-9)));
  std::uint64_t seen = 0;
  for (std::size_t b = 0; b < kBuckets; ++b) {
    seen += snapshot[b];
    if (seen >= rank && snapshot[b] > 0) return upper_edge(b);
  }
  return std::numeric_limits<std::size_t>::max();  // unreachable: seen reaches total
}

}  // namespace latte::memory::detail
