#pragma once
// Implementation detail of BuddyAllocator: its per-order sets of free block heads.
#include <cstdint>
#include <vector>

namespace latte::memory::detail {

// Set of indices in [0, n) with O(log64 n) insert, erase and find-lowest.
class IndexBitmap {
 public:
  void reset(std::uint32_t n);
  void insert(std::uint32_t i) noexcept;
  void erase(std::uint32_t i) noexcept;
  bool contains(std::uint32_t i) const noexcept { return (levels_[0][i >> 6] >> (i & 63)) & 1u; }
  bool empty() const noexcept { return levels_.back()[0] == 0; }
  std::uint32_t lowest() const noexcept;  // precondition: !empty()
  std::uint32_t count() const noexcept;
  bool summaries_consistent() const noexcept;

 private:
  std::vector<std::vector<std::uint64_t>> levels_;  // [0]: one bit per index; last: one word
};

}  // namespace latte::memory::detail
