#include "latte/batching/partition.hpp"

#include <limits>

#include "latte/error.hpp"

namespace latte::batching {

std::vector<std::pair<std::size_t, std::size_t>> partition(const std::vector<double>& pad_row_cost,
                                                           const std::vector<double>& alone_cost,
                                                           const std::vector<std::int64_t>& rows, double fixed,
                                                           std::int64_t max_rows) {
  const std::size_t n = rows.size();
  LATTE_EXPECTS(pad_row_cost.size() == n && alone_cost.size() == n, "partition: one cost of each kind per request");
  LATTE_EXPECTS(max_rows >= 1, "partition: max_rows must be >= 1");
  // best[j]: the cheapest plan of the first j requests; cut[j]: where its last run starts.
  std::vector<double> best(n + 1, std::numeric_limits<double>::infinity());
  std::vector<std::size_t> cut(n + 1, 0);
  best[0] = 0.0;
  for (std::size_t j = 1; j <= n; ++j) {
    const double per_row = pad_row_cost[j - 1];
    std::int64_t taken = 0;
    for (std::size_t i = j; i-- > 0;) {
      taken += rows[i];
      if (taken > max_rows && i < j - 1) break;
      const double run = (i == j - 1) ? alone_cost[i] : fixed + per_row * static_cast<double>(taken);
      const double candidate = best[i] + run;
      if (candidate < best[j]) {
        best[j] = candidate;
        cut[j] = i;
      }
    }
  }
  std::vector<std::pair<std::size_t, std::size_t>> runs;
  for (std::size_t j = n; j > 0; j = cut[j]) runs.emplace_back(cut[j], j);
  return {runs.rbegin(), runs.rend()};
}

}  // namespace latte::batching
