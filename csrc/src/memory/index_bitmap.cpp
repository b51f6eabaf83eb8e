#include "latte/memory/detail/index_bitmap.hpp"

namespace latte::memory::detail {
namespace {

unsigned trailing_zeros(std::uint64_t x) { return static_cast<unsigned>(__builtin_ctzll(x)); }

}  // namespace

void IndexBitmap::reset(std::uint32_t n) {
  levels_.clear();
  std::size_t words = (std::size_t(n) + 63) / 64;
  if (words == 0) words = 1;
  while (true) {
    levels_.emplace_back(words, 0);
    if (words == 1) break;
    words = (words + 63) / 64;
  }
}

void IndexBitmap::insert(std::uint32_t i) noexcept {
  for (auto& level : levels_) {
    std::uint64_t& word = level[i >> 6];
    const bool was_empty = word == 0;
    word |= 1ull << (i & 63);
    if (!was_empty) return;
    i >>= 6;
  }
}

void IndexBitmap::erase(std::uint32_t i) noexcept {
  for (auto& level : levels_) {
    std::uint64_t& word = level[i >> 6];
    word &= ~(1ull << (i & 63));
    if (word != 0) return;
    i >>= 6;
  }
}

std::uint32_t IndexBitmap::lowest() const noexcept {
  std::uint32_t i = 0;
  for (std::size_t l = levels_.size(); l-- > 0;) {
    i = (i << 6) | trailing_zeros(levels_[l][i]);
  }
  return i;
}

std::uint32_t IndexBitmap::count() const noexcept {
  std::uint32_t n = 0;
  for (std::uint64_t word : levels_[0]) n += static_cast<std::uint32_t>(__builtin_popcountll(word));
  return n;
}

bool IndexBitmap::summaries_consistent() const noexcept {
  for (std::size_t l = 1; l < levels_.size(); ++l) {
    for (std::size_t w = 0; w < levels_[l - 1].size(); ++w) {
      const bool summary_bit = (levels_[l][w >> 6] >> (w & 63)) & 1u;
      if (summary_bit != (levels_[l - 1][w] != 0)) return false;
    }
  }
  return true;
}

}  // namespace latte::memory::detail
