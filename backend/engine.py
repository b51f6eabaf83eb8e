"""Runs the requests of one `execute` call: batch, run, split, isolate failures."""

from __future__ import annotations

from typing import Dict, List, Sequence, Union

import numpy as np

from latte.backend.batching import assemble, plan_batches, split
from latte.backend.config import ModelSpec
from latte.backend.requests import ParsedRequest
from latte.backend.runtimes import Runtime

Result = Union[Dict[str, np.ndarray], Exception]


class ModelError(RuntimeError):
    """The model itself raised while running a request."""


class BatchEngine:
    def __init__(self, spec: ModelSpec, runtime: Runtime) -> None:
        self.spec = spec
        self.runtime = runtime
        self._out_dtypes = {t.name: t.dtype for t in spec.outputs}

    def infer(self, items: Sequence[Union[ParsedRequest, Exception]]) -> List[Result]:
        """One result per item, in order: outputs, or the exception that explains the failure."""
        results: List[Result] = [item if isinstance(item, Exception) else None for item in items]
        valid = [(i, item) for i, item in enumerate(items) if not isinstance(item, Exception)]
        for group in plan_batches(self.spec, valid):
            for position, outcome in self._run_group(group):
                results[position] = outcome
        return results

    def _run_group(self, group):
        batch = assemble(self.spec, group)
        try:
            outputs = self._run(batch.inputs)
            return list(zip([pos for pos, _ in batch.members], split(self.spec, batch, outputs)))
        except Exception as exc:
            if len(group) == 1:
                return [(group[0][0], ModelError(f"model {self.spec.name!r} failed: {type(exc).__name__}: {exc}"))]
        # One bad request must not fail its neighbours: retry each on its own.
        outcomes = []
        for item in group:
            outcomes.extend(self._run_group([item]))
        return outcomes

    def _run(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        outputs = self.runtime.run(feed)
        return {name: np.asarray(value, dtype=self._out_dtypes[name]) for name, value in outputs.items()}
