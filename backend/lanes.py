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
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from latte.backend.engine import BatchEngine, Result, Work
from latte.backend.errors import DeadlineExceeded, ModelError, Overloaded, RequestError
from latte.scheduling import RejectReason


class _Call:
    """The requests of one execute call, answered as the lanes finish them."""

    def __init__(self, on_results: Optional[Callable[[List[Tuple[int, Result]]], None]] = None) -> None:
        self.results: Dict[int, Result] = {}
        # With no callback, finished (position, result) pairs are drained by the thread that
        # called `run`; with one (`submit`), the lane that finished a request reports it.
        self.on_results = on_results
        self.finished: "queue.SimpleQueue[Tuple[int, Result]]" = queue.SimpleQueue()


# The scheduler's reasons by what they mean to a client. The names are the native core's
# (RejectReason's members), so a reason renamed in C++ fails this import, not a request.
_TIMED_OUT = frozenset(r.name for r in (RejectReason.deadline_passed, RejectReason.deadline_expired))


def refusal(model: str, capacity: int, reason: str, w: Work, now: float) -> Exception:
    """The one-line error a request the scheduler did not run is answered with."""
    name = reason.split(":", 1)[0]
    if name in _TIMED_OUT:
        return DeadlineExceeded(f"timed out: timeout_ms={w.options.timeout_ms:g} ran out before a lane could run "
                                f"the request (it waited {(now - w.arrival) * 1000:.1f} ms)")
    if name == RejectReason.displaced.name:
        return Overloaded(f"model {model!r} is overloaded: the request was shed from its full queue "
                          f"(max_queue_size={capacity}) for one of a higher priority_level; retry later")
    if name == RejectReason.queue_full.name:
        return Overloaded(f"model {model!r} is overloaded: its queue is full (max_queue_size={capacity}) of requests "
                          f"of priority_level {w.options.priority} or higher; retry later")
    if name == RejectReason.shutdown.name:
        return Overloaded(f"model {model!r} is shutting down: the request was not run; retry later")
    if name == RejectReason.too_large.name:
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
        self.queue_capacity = queue_capacity
        batch = max(1, engine.spec.signature.max_batch_size)
        self.scheduler = AffinityScheduler(
            self._execute, self._complete, lanes=list(lane_cpus) if lane_cpus else lanes,
            max_batch_size=batch, max_batch_bytes=1 << 40, queue_capacity=queue_capacity,
            # When execute waits for its answers, Triton's dynamic batcher already waited for
            # this call's requests and nothing more can arrive until it returns, so holding a
            # batch back would only add latency (0). A model with async_execute (`submit`) gathers
            # requests of several calls here, so a window can let batches grow.
            max_window_s=max_window_s,
        )

    def run(self, work: Sequence[Work], now: float) -> Iterator[List[Tuple[int, Result]]]:
        """Submit the work of one execute call; yields [(position, result), ...] on the
        calling thread as the lanes finish requests, until every request is in."""
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
            yield finished

    def submit(self, work: Sequence[Work], now: float, on_results: Callable[[List[Tuple[int, Result]]], None]) -> None:
        """Submit the work of one execute call and return at once; `on_results` is called
        once per request, on the lane that finished it (or here, for a refusal)."""
        call = _Call(on_results)
        self._enqueue(work, now, call)

    def _enqueue(self, work: Sequence[Work], now: float, call: _Call) -> None:
        """Queue the call's work. Raising (its plan failed), it queued none of it; once some is
        queued, what cannot be is answered through the call, as the queued work is."""
        keys = self.engine.planned_keys(work)
        # Idle lanes start on whatever is submitted first, so the most urgent goes first.
        ordered = sorted(work, key=lambda w: (-w.options.priority, w.deadline))
        for index, w in enumerate(ordered):
            request_id = next(self._ids)
            with self._lock:
                self._pending[request_id] = (w, call)
            timeout = None if w.options.timeout_ms is None else max(0.0, w.deadline - now)
            # A refusal (or a queued request this one displaces) is reported through
            # _complete, the request's one answer.
            try:
                self.scheduler.submit(request_id, repr(keys[w.position]),
                                      priority=w.options.priority,  # options.py admits the native levels only
                                      timeout_s=timeout, size=w.request.rows)
            except Exception as exc:
                with self._lock:
                    self._pending.pop(request_id, None)
                failure = ModelError(f"model {self.engine.spec.signature.name!r} could not queue the request: "
                                     f"{type(exc).__name__}: {exc}")
                for left in ordered[index:]:
                    self._answer(call, left.position, failure)
                return

    def _execute(self, key: str, request_ids: List[int], lane: int) -> None:
        started = time.monotonic()
        with self._lock:
            items = [self._pending[i] for i in request_ids]
        # An async_execute batch can hold requests of several execute calls, whose positions
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
            if error is not None:
                outcome = refusal(self.engine.spec.signature.name, self.queue_capacity, error, w, self.engine.clock())
            else:
                outcome = ModelError("the batch finished without a result")
        self._answer(call, w.position, outcome)

    @staticmethod
    def _answer(call: _Call, position: int, outcome: Result) -> None:
        """A request's one answer, to whoever waits for the call's."""
        if call.on_results is not None:
            call.on_results([(position, outcome)])
        else:
            call.finished.put((position, outcome))

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
