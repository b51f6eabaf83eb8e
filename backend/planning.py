"""Cost-aware batch planning: which requests of one `execute` call share a model call.

Grouping strictly by shape bucket splits a handful of requests into as many model calls
as there are buckets among them, and every call pays a fixed price (runtime call, buffer
assembly, splitting) however few rows it carries. Here a batch may take requests of
smaller buckets too, padded to the bucket edge of its longest member, when the estimated
cost says so:

    cost(batch) = fixed_s + per_row_s(edge) x rows

Requests sorted by length are cut into contiguous runs by dynamic programming. A request
alone in its batch is not padded, so a run of one costs what one call of its own length
costs: measured one-row calls (single_s) where the model has them, else fixed_s +
per_row_s(its own length) x rows. The line is fitted to batches of several rows, and a
runtime's one-row call is often cheaper than the line's intercept says (measured on the
sequence encoder: ~55 us against a 75-110 us intercept), which made merging look cheaper
than one call per request when it was not; so the plan never costs more than one call
per request, by the model's own measurements. With one row per
request a contiguous partition is optimal among all partitions (a batch's cost depends
only on its longest member and its row count, and a lone request's grows with its length,
so handing the longest requests to the batch with the longest edge never costs more); with
multi-row requests the max_batch_size limit makes it a packing problem, and the plan is
the best contiguous one.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from latte._native import partition_runs

PLANNINGS = ("cost", "bucket")

# Without measurements (warmup off): one model call costs as much as 64 padded positions
# of one row. The example sequence encoder measured 100..150 positions on a 2-core CPU, and
# this guess served it about as fast as its measured model (docs/benchmarks.md); erring
# low only keeps more bucket boundaries, which is where bucket planning stood.
DEFAULT_FIXED_POSITIONS = 64.0


@dataclass(frozen=True)
class CostModel:
    """Estimated seconds of one model call: fixed_s + per_row_s(edge) x rows."""

    fixed_s: float
    per_row_s: Mapping[int, float]     # bucket edge -> seconds per row padded to it
    single_s: Optional[Mapping[int, float]] = None  # bucket edge -> seconds of a one-row call at that length

    def __post_init__(self) -> None:
        if not self.per_row_s:
            raise ValueError("a cost model needs the per-row cost of at least one bucket edge")
        if self.fixed_s < 0 or any(v < 0 for v in self.per_row_s.values()):
            raise ValueError(f"costs must be >= 0 seconds, got fixed_s={self.fixed_s}, per_row_s={dict(self.per_row_s)}")
        edges = sorted(self.per_row_s)
        costs = [self.per_row_s[e] for e in edges]
        if any(b < a for a, b in zip(costs, costs[1:])):
            # The planner's optimality rests on a longer padding never being cheaper per row.
            raise ValueError(f"per-row costs must not decrease with the bucket edge, got {dict(self.per_row_s)}")
        object.__setattr__(self, "_edges", edges)
        object.__setattr__(self, "_edge_costs", costs)
        # Every call prices each of its requests: lengths repeat, so their costs are kept.
        object.__setattr__(self, "_row_costs", {})
        object.__setattr__(self, "_alone_costs", {})
        if self.single_s is not None:
            if not self.single_s or any(v < 0 for v in self.single_s.values()):
                raise ValueError(f"one-row costs must be >= 0 seconds, got {dict(self.single_s)}")
            # Kept non-decreasing in the length, like the per-row costs: the plan's optimality
            # needs a lone request's cost to grow with its length.
            single, floor = {}, 0.0
            for edge in sorted(self.single_s):
                floor = max(floor, self.single_s[edge])
                single[edge] = floor
            object.__setattr__(self, "single_s", single)
            object.__setattr__(self, "_single_edges", list(single))  # built in ascending order
            object.__setattr__(self, "_single_costs", list(single.values()))

    @classmethod
    def default(cls, edges: Sequence[int]) -> "CostModel":
        """Cost proportional to padded positions, plus DEFAULT_FIXED_POSITIONS per call."""
        unit = 1e-6  # the scale is irrelevant to the plan; only the ratios matter
        return cls(DEFAULT_FIXED_POSITIONS * unit, {int(e): e * unit for e in edges})

    @classmethod
    def fit(cls, timings: Mapping[int, Sequence[Tuple[int, float]]],
            one_row: Optional[Mapping[int, float]] = None) -> "CostModel":
        """From edge -> [(rows, seconds), ...], a least-squares line per edge; the fixed cost
        is the median intercept across edges (one call's overhead does not depend on the
        shape), and per-row costs are kept non-decreasing in the edge so that noise cannot
        make a longer padding look cheaper. `one_row` adds one-row calls timed at lengths
        between the edges (length -> seconds)."""
        if not timings:
            raise ValueError("no timings to fit a cost model to")
        slopes, intercepts, single = {}, [], dict(one_row or {})
        for edge, points in sorted(timings.items()):
            ones = [seconds for rows, seconds in points if rows == 1]
            if ones:
                single[edge] = min(ones)
            # The line describes batches; one-row calls are kept apart (single_s) where there
            # are batches of two or more row counts to fit it to.
            several = [(rows, seconds) for rows, seconds in points if rows >= 2]
            if len({rows for rows, _ in several}) >= 2:
                points = several
            xs = [float(rows) for rows, _ in points]
            if len(set(xs)) < 2:
                raise ValueError(f"edge {edge}: need timings of at least two row counts, got {sorted(set(xs))}")
            ys = [seconds for _, seconds in points]
            mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
            slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
                     / sum((x - mean_x) ** 2 for x in xs))
            slopes[edge] = max(0.0, slope)
            intercepts.append(mean_y - slope * mean_x)
        intercepts.sort()
        fixed = max(0.0, intercepts[len(intercepts) // 2])
        per_row, floor = {}, 0.0
        for edge in sorted(slopes):
            floor = max(floor, slopes[edge])
            per_row[edge] = floor
        return cls(fixed, per_row, single or None)

    def row_cost(self, edge: int) -> float:
        """Per-row seconds at `edge`: measured edges as measured, others along the measured
        ones (priced_at)."""
        cost = self._row_costs.get(edge)  # type: ignore[attr-defined]
        if cost is None:
            cost = _remember(self._row_costs, edge,  # type: ignore[attr-defined]
                             priced_at(self._edges, self._edge_costs, edge))  # type: ignore[attr-defined]
        return cost

    def alone_cost(self, length: int, rows: int) -> float:
        """One request alone in its call, at its own length."""
        if rows != 1 or not self.single_s:
            return self.fixed_s + self.row_cost(length) * rows
        cost = self._alone_costs.get(length)  # type: ignore[attr-defined]
        if cost is None:
            cost = _remember(self._alone_costs, length,  # type: ignore[attr-defined]
                             priced_at(self._single_edges, self._single_costs, length))  # type: ignore[attr-defined]
        return cost

    def describe(self) -> str:
        rows = ", ".join(f"{e}: {v * 1e6:.1f}" for e, v in sorted(self.per_row_s.items()))
        text = f"fixed {self.fixed_s * 1e6:.1f} us + per row (edge: us) {{{rows}}}"
        if self.single_s:
            text += "; one row (length: us) {" + ", ".join(f"{e}: {v * 1e6:.1f}" for e, v in sorted(self.single_s.items())) + "}"
        return text


def priced_at(lengths: Sequence[int], costs: Sequence[float], length: int) -> float:
    """The cost at `length` from costs measured at ascending `lengths` (non-decreasing):
    between two measurements on the line through them; past the last in proportion to the
    length; below the first along the line through the first two, at least in proportion (a
    cost with a fixed part is not halved with the length, and a flat one stays flat). One
    measurement says nothing of how the cost falls below it, so shorter lengths cost as much:
    a model whose cost is its dense layers costs the same at 4 tokens as at 64 (priced in
    proportion, the ranker's short requests were cut into batches of their own, ~1.25x the
    compute per row served). Erring high only merges, where the padded batch is measured."""
    i = bisect.bisect_left(lengths, length)
    if i < len(lengths) and lengths[i] == length:
        return costs[i]
    if i == len(lengths):
        return costs[-1] * length / lengths[-1]
    if i == 0:
        if len(lengths) == 1:
            return costs[0]
        slope = (costs[1] - costs[0]) / (lengths[1] - lengths[0])
        return max(costs[0] * length / lengths[0], costs[0] - slope * (lengths[0] - length))
    low, high = lengths[i - 1], lengths[i]
    return costs[i - 1] + (costs[i] - costs[i - 1]) * (length - low) / (high - low)


_MAX_REMEMBERED = 4096  # distinct lengths whose costs are kept, so odd traffic cannot grow them


def _remember(costs: dict, key: int, cost: float) -> float:
    if len(costs) < _MAX_REMEMBERED:
        costs[key] = cost
    return cost


def partition(lengths: Sequence[int], rows: Sequence[int], edge_for: Callable[[int], int],
              cost: CostModel, max_rows: int) -> List[Tuple[int, int]]:
    """Cut items sorted by length (ascending) into [start, end) runs of at most max_rows rows
    each, minimising the summed cost of the runs (latte._native.partition_runs)."""
    n = len(lengths)
    if len(rows) != n:
        raise ValueError(f"got {n} lengths but {len(rows)} row counts")
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    for i in range(1, n):
        if lengths[i] < lengths[i - 1]:
            raise ValueError("lengths must be sorted ascending")
    # The per-request costs here; the dynamic program over them natively (it is O(n x
    # max_rows) and runs every call).
    pad_row_cost = [cost.row_cost(edge_for(length)) for length in lengths]  # a run pads to its last member
    # A request alone in its batch is not padded (see batching.assemble): its own length.
    alone_cost = [cost.alone_cost(length, r) for length, r in zip(lengths, rows)]
    return partition_runs(pad_row_cost, alone_cost, list(rows), cost.fixed_s, max_rows)


def plan_by_cost(lengths: Sequence[int], rows: Sequence[int], edge_for: Callable[[int], int],
                 cost: CostModel, max_rows: int) -> List[List[int]]:
    """Indices into `lengths` grouped into batches; input order need not be sorted. Ties in
    length keep their original order, so the plan is deterministic."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    runs = partition([lengths[i] for i in order], [rows[i] for i in order], edge_for, cost, max_rows)
    return [order[start:end] for start, end in runs]


def parse_planning(text: Optional[str]) -> str:
    value = (text or "cost").strip().lower()
    if value not in PLANNINGS:
        raise ValueError(f"batch_planning must be one of {', '.join(PLANNINGS)}, got {text!r}")
    return value

