"""Runs the requests of one `execute` call: sessions, batching, priorities, deadlines,
model calls, splitting, and isolation of failures."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from latte.backend.batching import Allocate, affinity_key, assemble, plan_batches, split
from latte.backend.buckets import BucketPlan
from latte.backend.config import ModelSpec
from latte.backend.options import RequestOptions
from latte.backend.requests import ParsedRequest, RequestError
from latte.backend.runtimes import Runtime
from latte.backend.sessions import SessionStore

Result = Union[Dict[str, np.ndarray], Exception]


class ModelError(RuntimeError):
    """The model itself raised while running a request."""


class DeadlineExceeded(RuntimeError):
    """The request waited longer than its timeout_ms before it could run."""


@dataclass
class BatchRecord:
    """What one model call did, for metrics."""
    rows: int
    requests: int
    padded_length: Optional[int]
    seconds: float
    failed: bool


@dataclass
class Work:
    position: int
    request: ParsedRequest
    options: RequestOptions = field(default_factory=RequestOptions)
    arrival: float = 0.0

    @property
    def deadline(self) -> float:
        if self.options.timeout_ms is None:
            return float("inf")
        return self.arrival + self.options.timeout_ms / 1000.0


class BatchEngine:
    def __init__(self, spec: ModelSpec, runtime: Runtime, buckets: Optional[BucketPlan] = None,
                 sessions: Optional[SessionStore] = None, session_input: Optional[str] = None,
                 allocate: Allocate = np.empty, clock: Callable[[], float] = time.monotonic,
                 on_batch: Optional[Callable[[BatchRecord], None]] = None) -> None:
        self.spec = spec
        self.runtime = runtime
        self.buckets = buckets
        self.sessions = sessions
        self.session_input = session_input
        self.allocate = allocate
        self.clock = clock
        self.on_batch = on_batch
        self.dispatcher = None  # a LaneDispatcher runs batches on scheduler lanes when set
        self._out_dtypes = {t.name: t.dtype for t in spec.outputs}

    # -- the whole call -------------------------------------------------------------------
    def infer(self, items: Sequence[Union[ParsedRequest, Exception]],
              options: Optional[Sequence[Optional[RequestOptions]]] = None,
              on_result: Optional[Callable[[int, Result], None]] = None) -> List[Result]:
        """One result per item, in order: outputs, or the exception that explains the failure.

        `on_result(position, result)` is called once per item as soon as its result is known
        (from a scheduler lane when lanes run the batches), so answers can leave in the order
        priorities ran them rather than all at the end of the call.
        """
        now = self.clock()
        results: List[Result] = [item if isinstance(item, Exception) else None for item in items]
        work: List[Work] = []
        for i, item in enumerate(items):
            if isinstance(item, Exception):
                continue
            opts = (options[i] if options is not None else None) or RequestOptions()
            try:
                work.append(Work(i, self._with_session(item, opts), opts, now))
            except RequestError as exc:
                results[i] = exc
        if on_result is not None:
            for position, outcome in enumerate(results):
                if outcome is not None:
                    on_result(position, outcome)
        if self.dispatcher is not None:
            # Idle lanes start on whatever is submitted first, so the most urgent goes first.
            work.sort(key=lambda w: (-w.options.priority, w.deadline))
            results_by_position = self.dispatcher.run(work, now, on_result)
        else:
            results_by_position = {}
            for group in self.order(self._groups(work)):
                outcomes = self._run_in_time(group)
                results_by_position.update(outcomes)
                if on_result is not None:
                    for position, outcome in outcomes:
                        on_result(position, outcome)
        for position, outcome in results_by_position.items():
            results[position] = outcome
        return results

    def _groups(self, work: Sequence[Work]) -> List[List[Work]]:
        by_position = {w.position: w for w in work}
        return [[by_position[pos] for pos, _ in group]
                for group in plan_batches(self.spec, [(w.position, w.request) for w in work], self.buckets)]

    @staticmethod
    def order(groups: List[List[Work]]) -> List[List[Work]]:
        """Higher priority first, then the earliest deadline."""
        return sorted(groups, key=lambda g: (-max(w.options.priority for w in g), min(w.deadline for w in g)))

    # -- one batch ------------------------------------------------------------------------
    def run_group(self, group: Sequence[Work]) -> List[Tuple[int, Result]]:
        """Run work of one affinity key as handed over by the scheduler, split where it
        exceeds max_batch_size rows."""
        return [outcome for batch in self._groups(group) for outcome in self._run_in_time(batch)]

    def _run_in_time(self, group: Sequence[Work]) -> List[Tuple[int, Result]]:
        """Run one planned batch, failing the requests whose deadline has already passed;
        a model failure is retried request by request so one bad request does not fail its
        neighbours."""
        now = self.clock()
        outcomes: List[Tuple[int, Result]] = []
        live = []
        for w in group:
            if now > w.deadline:
                waited = (now - w.arrival) * 1000
                outcomes.append((w.position, DeadlineExceeded(
                    f"timed out: waited {waited:.1f} ms, longer than timeout_ms={w.options.timeout_ms:g}")))
            else:
                live.append(w)
        if live:
            outcomes.extend(self._run(live))
        return outcomes

    def _run(self, group: Sequence[Work]) -> List[Tuple[int, Result]]:
        started = self.clock()
        batch = None
        try:
            batch = assemble(self.spec, [(w.position, w.request) for w in group], self.buckets, self.allocate)
            outputs = self._call(batch.inputs)
            parts = split(self.spec, batch, outputs)
            self._record(batch, len(group), started, failed=False)
        except MemoryError as exc:
            # Not the model's fault and not the request's: the arena is full right now.
            return [(w.position, exc) for w in group]
        except Exception as exc:
            if batch is not None:
                self._record(batch, len(group), started, failed=True)
            if len(group) == 1:
                return [(group[0].position, ModelError(f"model {self.spec.name!r} failed: {type(exc).__name__}: {exc}"))]
            outcomes = []
            for w in group:
                outcomes.extend(self._run([w]))
            return outcomes
        finally:
            del batch  # arena-backed input buffers go back as soon as the call is over
        for w in group:
            self._commit_session(w)
        return [(w.position, part) for w, part in zip(group, parts)]

    def _call(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        outputs = self.runtime.run(feed)
        return {name: np.asarray(value, dtype=self._out_dtypes[name]) for name, value in outputs.items()}

    def _record(self, batch, requests: int, started: float, failed: bool) -> None:
        if self.on_batch is not None:
            self.on_batch(BatchRecord(rows=batch.rows, requests=requests, padded_length=batch.padded_length,
                                      seconds=self.clock() - started, failed=failed))

    # -- sessions -------------------------------------------------------------------------
    def _with_session(self, request: ParsedRequest, opts: RequestOptions) -> ParsedRequest:
        if opts.session_id is None:
            return request
        if self.sessions is None or self.session_input is None:
            raise RequestError(f"model {self.spec.name!r} keeps no session state; drop session_id "
                               f"(or set the parameter session_input in its config)")
        tokens = request.inputs[self.session_input]
        sequence = self.sessions.extend(opts.session_id, tokens, opts.session_start)
        return ParsedRequest(inputs={**request.inputs, self.session_input: sequence}, rows=1,
                             parameters=request.parameters)

    def _commit_session(self, w: Work) -> None:
        if w.options.session_id is not None and self.sessions is not None:
            self.sessions.commit(w.options.session_id, w.request.inputs[self.session_input], w.options.session_end)

    def affinity_key(self, request: ParsedRequest) -> tuple:
        return affinity_key(self.spec, request, self.buckets)
