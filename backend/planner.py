"""The one planner: which requests of a call share a model call.

It owns what a plan depends on (the model's signature and serving options, its shape
buckets, its cost model, measured at load on the path that serves) and decides once per call
whether the call fits one batch. Each model step holds one, and a plain model (a graph of one
model step) is planned by its step's, so the same model takes the same plan for the same
requests wherever it runs.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from latte.backend.batching import plan_batches, plan_rows, uniform_shapes
from latte.backend.requests import ParsedRequest
from latte.backend.buckets import BucketPlan
from latte.backend.config import ModelSpec
from latte.backend.planning import CostModel


class BatchPlanner:
    def __init__(self, spec: ModelSpec, cost_model: Optional[CostModel] = None) -> None:
        serving = spec.serving
        self.spec = spec
        self.buckets = BucketPlan(serving.bucket_edges) if serving.bucket_edges else None
        self.max_rows = max(1, spec.signature.max_batch_size)
        self._batched = spec.signature.batched
        # Cost planning lets requests of smaller buckets ride in a larger bucket's batch; the
        # default model is replaced by one measured at warmup (warmup.measure_cost_model).
        if cost_model is None and serving.batch_planning == "cost" and self.buckets is not None:
            cost_model = CostModel.default(self.buckets.edges)
        self.cost_model = cost_model if serving.batch_planning == "cost" else None
        # Every request of one shape key (one shape, or ragged inputs of one rank): a call is
        # planned by its rows and lengths alone, and may be read by input.
        self.one_shape_key = spec.signature.batched and uniform_shapes(spec)
        # Of one shape and no ragged input: a call is cut by rows alone.
        self._one_shape = self.one_shape_key and not spec.signature.ragged_inputs

    def fits(self, rows: int) -> bool:
        """Whether `rows` rows may run as one model call: what the plan and the scheduler's
        groups ask before cutting a call into batches."""
        return self._batched and rows <= self.max_rows

    def plan(self, rows: Sequence[int], lengths: Optional[Sequence[int]]) -> List[Sequence[int]]:
        """Indices of requests of one shape key (`rows` each, ragged `lengths` or None) in
        batches within max_batch_size; a plan of one batch is all of them, in order."""
        if (lengths is None or len(rows) == 1) and self._batched and sum(rows) <= self.max_rows:
            # Fits, asked without a call; a lone request runs alone whatever its length.
            return [range(len(rows))]
        plan = plan_rows(self.spec, rows, lengths, self.buckets, self.cost_model)
        if len(plan) == 1 and len(plan[0]) == len(rows):
            return [range(len(rows))]  # one batch of all: packed and answered in the call's order
        return plan

    def plan_requests(self, pairs: Sequence[Tuple[int, ParsedRequest]]) -> List[List[Tuple[int, ParsedRequest]]]:
        """(position, request) pairs in batches: requests of one shape key each, planned by
        `plan`."""
        if len(pairs) == 1 and self.fits(pairs[0][1].rows):  # a lone request runs alone
            return [list(pairs)]
        if self._one_shape:
            return [[pairs[i] for i in batch] for batch in self.plan([r.rows for _, r in pairs], None)]
        return plan_batches(self.spec, pairs, self.buckets, self.cost_model)

    def edge(self, longest: Optional[int]) -> Optional[int]:
        """The bucket edge of a batch whose longest member has `longest` (its affinity key)."""
        if self.buckets is None or longest is None:
            return None
        return self.buckets.edge_for(longest)
