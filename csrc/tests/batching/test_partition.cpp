// The planner's dynamic program against every contiguous cut, on seeded random costs.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "../check.hpp"
#include "latte/batching/partition.hpp"
#include "latte/error.hpp"

using namespace latte::batching;

namespace {

double plan_cost(const std::vector<std::pair<std::size_t, std::size_t>>& runs, const std::vector<double>& pad,
                 const std::vector<double>& alone, const std::vector<std::int64_t>& rows, double fixed) {
  double total = 0.0;
  for (auto [start, end] : runs) {
    if (end - start == 1) {
      total += alone[start];
      continue;
    }
    std::int64_t taken = 0;
    for (std::size_t i = start; i < end; ++i) taken += rows[i];
    total += fixed + pad[end - 1] * static_cast<double>(taken);
  }
  return total;
}

}  // namespace

TEST_CASE("a high fixed cost puts every request in one run, a high row cost keeps them apart") {
  const std::vector<std::int64_t> rows{1, 1, 1, 1};
  const std::vector<double> pad{1.0, 2.0, 3.0, 4.0};
  const std::vector<double> alone{50.0, 60.0, 70.0, 80.0};
  const auto together = partition(pad, alone, rows, 100.0, 8);
  CHECK(together.size() == 1 && together[0] == std::make_pair(std::size_t{0}, std::size_t{4}));
  const auto apart = partition({100.0, 200.0, 300.0, 400.0}, {1.0, 2.0, 3.0, 4.0}, rows, 1.0, 8);
  CHECK(apart.size() == 4);
}

TEST_CASE("runs never hold more than max_rows rows, but a request larger than that runs alone") {
  const std::vector<std::int64_t> rows{2, 9, 2};
  const auto runs = partition({1.0, 1.0, 1.0}, {1000.0, 1000.0, 1000.0}, rows, 100.0, 8);
  CHECK(runs.size() == 3);
  CHECK(partition({}, {}, {}, 1.0, 4).empty());
}

TEST_CASE("the plan is the cheapest contiguous cut (seeded random costs)") {
  std::mt19937 rng(20261123);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 500; ++trial) {
    const std::size_t n = 1 + rng() % 9;
    std::vector<std::int64_t> rows(n);
    std::vector<double> pad(n), alone(n);
    double running = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      rows[i] = 1 + static_cast<std::int64_t>(rng() % 4);
      running += 3.0 * unit(rng);
      pad[i] = running;  // non-decreasing with the length, as the cost model keeps it
      alone[i] = 20.0 * unit(rng) + running;
    }
    const double fixed = 20.0 * unit(rng);
    const std::int64_t max_rows = 4 + static_cast<std::int64_t>(rng() % 6);
    const auto runs = partition(pad, alone, rows, fixed, max_rows);
    std::size_t covered = 0;
    bool within = true;
    for (auto [start, end] : runs) {
      CHECK(start == covered && end > start);
      covered = end;
      std::int64_t taken = 0;
      for (std::size_t i = start; i < end; ++i) taken += rows[i];
      within = within && (end - start == 1 || taken <= max_rows);
    }
    CHECK(covered == n && within);
    double best = std::numeric_limits<double>::infinity();
    for (std::uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
      std::vector<std::pair<std::size_t, std::size_t>> candidate;
      std::size_t start = 0;
      bool fits = true;
      for (std::size_t i = 1; i <= n; ++i) {
        if (i == n || (cuts >> (i - 1)) & 1u) {
          std::int64_t taken = 0;
          for (std::size_t k = start; k < i; ++k) taken += rows[k];
          fits = fits && (i - start == 1 || taken <= max_rows);
          candidate.emplace_back(start, i);
          start = i;
        }
      }
      if (fits) best = std::min(best, plan_cost(candidate, pad, alone, rows, fixed));
    }
    const double got = plan_cost(runs, pad, alone, rows, fixed);
    CHECK(got <= best * (1.0 + 1e-12) + 1e-12);
  }
}

TEST_CASE("costs of the wrong length are refused") {
  CHECK_THROWS_AS(partition({1.0}, {1.0, 2.0}, {1, 1}, 1.0, 4), latte::logic_error);
  CHECK_THROWS_AS(partition({1.0}, {1.0}, {1}, 1.0, 0), latte::logic_error);
}

int main() { return latte::testing::run_all(); }
