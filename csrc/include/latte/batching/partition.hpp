#pragma once
// The planner's dynamic program (backend/planning.py): cut requests sorted by length into
// contiguous runs of at most max_rows rows each, minimising the summed cost of the runs. The
// costs come in precomputed per request, so the core knows nothing of cost models; it runs
// once per execute call, which in Python cost more than the batches it saved on short calls.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace latte::batching {

// Request i (sorted ascending by length) brings rows[i] rows; a run [start, end) with more than
// one request costs fixed + pad_row_cost[end - 1] x its rows (padded to its last, longest
// member), and a request alone costs alone_cost[i]. A lone request may exceed max_rows.
// Returns the runs in order as (start, end) pairs.
std::vector<std::pair<std::size_t, std::size_t>> partition(const std::vector<double>& pad_row_cost,
                                                           const std::vector<double>& alone_cost,
                                                           const std::vector<std::int64_t>& rows, double fixed,
                                                           std::int64_t max_rows);

}  // namespace latte::batching
