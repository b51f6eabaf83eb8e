"""Running the batches of one `execute` call on the AffinityScheduler's lanes.

Each request is submitted with its affinity key (its shapes and the bucket edge of the batch
the engine planned it into) and its priority and deadline; the scheduler groups requests of
one key into batches, places each batch on the lane that ran that key last, and reports
every request exactly once through `_complete`. `run` hands results to its caller on
the calling thread as they arrive and returns once every request of the call is answered,
which keeps Triton's one-response-per-request contract for ordinary (non-decoupled) models.
The call's work is submitted most urgent first, because an idle lane starts on the first
request it gets.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from latte.backend.engine import BatchEngine, DeadlineExceeded, ModelError, Result, Work
from latte.backend.requests import RequestError


class Overloaded(RuntimeError):
    """The scheduler's bounded queue could not take the request."""


class _Call:
    """The requests of one execute call, answered as the lanes finish them."""

    def __init__(self, on_results: Optional[Callable[[List[Tuple[int, Result]]], None]] = None) -> None:
        self.results: Dict[int, Result] = {}
        # With no callback, finished (position, result) pairs are drained by the thread that
        # called `run`; with one (`submit`), the lane that finished a request reports it.
        self.on_results = on_results
        self.finished: "queue.SimpleQueue[Tuple[int, Result]]" = queue.SimpleQueue()


def _error_for(reason: str) -> Exception:
    name = reason.split(":", 1)[0]
    if name in ("deadline_passed", "deadline_expired"):
        return DeadlineExceeded(f"timed out in the scheduler ({reason})")
    if name in ("queue_full", "displaced", "shutdown"):
        return Overloaded(f"overloaded: the request was not admitted ({reason})")
    if name == "too_large":
        return RequestError(f"request too large for a batch ({reason})")
    return ModelError(f"batch failed ({reason})")


class LaneDispatcher:
    def __init__(self, engine: BatchEngine, lanes: int, lane_cpus: Optional[Sequence[Sequence[int]]] = None,
                 queue_capacity: int = 4096, max_window_s: float = 0.0) -> None:
        from latte.scheduling import AffinityScheduler

        self.engine = engine
        self._lock = threading.Lock()
        self._pending: Dict[int, Tuple[Work, _Call]] = {}
        self._ids = itertools.count(1)
        self._started = time.monotonic()
        self._busy_s: Dict[int, float] = {}
        batch = max(1, engine.spec.signature.max_batch_size)
        self.scheduler = AffinityScheduler(
            self._execute, self._complete, lanes=list(lane_cpus) if lane_cpus else lanes,
            max_batch_size=batch, max_batch_bytes=1 << 40, queue_capacity=queue_capacity,
            # When execute waits for its answers, Triton's dynamic batcher already waited for
            # this call's requests and nothing more can arrive until it returns, so holding a
            # batch back would only add latency (0). A pipelined model (`submit`) gathers
            # requests of several calls here, so a window can let batches grow.
            max_window_s=max_window_s,
        )

    def run(self, work: Sequence[Work], now: float, on_results: Callable[[List[Tuple[int, Result]]], None]) -> None:
        """Submit the work of one execute call; `on_results([(position, result), ...])` is
        called on this thread with what the lanes have finished, until every request is in."""
        call = _Call()
        self._enqueue(work, now, call)
        remaining = len(work)
        while remaining:
            finished = [call.finished.get()]
            while len(finished) < remaining:
                try:
                    finished.append(call.finished.get_nowait())
                except queue.Empty:
                    break
            remaining -= len(finished)
            on_results(finished)

    def submit(self, work: Sequence[Work], now: float, on_results: Callable[[List[Tuple[int, Result]]], None]) -> None:
        """Submit the work of one execute call and return at once; `on_results` is called
        once per request, on the lane that finished it (or here, for a refusal)."""
        call = _Call(on_results)
        self._enqueue(work, now, call)

    def _enqueue(self, work: Sequence[Work], now: float, call: _Call) -> None:
        keys = self.engine.planned_keys(work)
        # Idle lanes start on whatever is submitted first, so the most urgent goes first.
        for w in sorted(work, key=lambda w: (-w.options.priority, w.deadline)):
            request_id = next(self._ids)
            with self._lock:
                self._pending[request_id] = (w, call)
            timeout = None if w.options.timeout_ms is None else max(0.0, w.deadline - now)
            # A refusal is also reported through _complete, the request's one answer.
            self.scheduler.submit(request_id, repr(keys[w.position]),
                                  priority=w.options.priority,  # options.py admits the native levels only
                                  timeout_s=timeout, size=w.request.rows)

    def _execute(self, key: str, request_ids: List[int], lane: int) -> None:
        started = time.monotonic()
        with self._lock:
            items = [self._pending[i] for i in request_ids]
        # A pipelined batch can hold requests of several execute calls, whose positions
        # repeat, so the batch numbers its work afresh and maps the results back.
        outcomes = self.engine.run_group([w.at(i) for i, (w, _) in enumerate(items)])
        with self._lock:
            for index, outcome in outcomes:
                w, call = items[index]
                call.results[w.position] = outcome
            self._busy_s[lane] = self._busy_s.get(lane, 0.0) + time.monotonic() - started

    def _complete(self, request_id: int, error: Optional[str]) -> None:
        with self._lock:
            w, call = self._pending.pop(request_id)
            outcome = call.results.pop(w.position, None)
        if outcome is None:
            outcome = _error_for(error) if error is not None else ModelError("the batch finished without a result")
        if call.on_results is not None:
            call.on_results([(w.position, outcome)])
        else:
            call.finished.put((w.position, outcome))

    def metrics(self) -> dict:
        """The scheduler's figures plus each lane's utilization (busy share since start)."""
        figures = self.scheduler.metrics()
        elapsed = max(1e-9, time.monotonic() - self._started)
        with self._lock:
            for lane in range(self.scheduler.lanes):
                figures[f"lane{lane}_utilization"] = self._busy_s.get(lane, 0.0) / elapsed
        return figures

    def close(self) -> None:
        self.scheduler.close(drain=False)
