"""Locality-aware request scheduling (see docs/scheduling.md).

The scheduler runs in native threads ("lanes"), one per CPU set. Requests that share an
affinity key (model, session, shape bucket) are batched together and sent to the lane that ran
that key last, so its caches and warm state are reused. Python is entered only for the model
call (``execute``), the optional ``prefetch`` hint and ``on_complete``, which receives every
request's outcome exactly once::

    def execute(key, request_ids, lane): ...          # runs one batch; raising fails it
    def on_complete(request_id, error): ...           # error is None or a reason string

    with AffinityScheduler(execute, on_complete, lanes=[[0], [1]]) as scheduler:
        scheduler.submit(7, "bert/seq128", priority=1, timeout_s=0.05, size=128)
"""

from __future__ import annotations

import atexit
import threading
import warnings
import weakref
from typing import Callable, Optional, Sequence, Union

# The scheduler's limits and names are the native core's: read here, never written again.
from latte._native import PRIORITY_LEVELS, REJECT_REASONS, RejectReason
from latte._native import AffinityScheduler as _NativeAffinityScheduler

__all__ = ["AffinityScheduler", "PRIORITY_LEVELS", "REJECT_REASONS", "RejectReason"]

# Lanes must be stopped before the interpreter goes away: they would call into a dead one.
_open_schedulers: "weakref.WeakSet[AffinityScheduler]" = weakref.WeakSet()
_open_lock = threading.Lock()


def _close_all_at_exit() -> None:
    with _open_lock:
        schedulers = list(_open_schedulers)
    for scheduler in schedulers:
        if not scheduler.closed:
            scheduler.close(drain=False)


atexit.register(_close_all_at_exit)


def _lane_cpus(lanes: Union[int, Sequence[Sequence[int]]]) -> list:
    if isinstance(lanes, bool):
        raise TypeError("lanes must be a lane count (int) or a list of CPU lists, got bool")
    if isinstance(lanes, int):
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, got {lanes}")
        return [[] for _ in range(lanes)]
    if not isinstance(lanes, (list, tuple)) or not lanes:
        raise TypeError(
            f"lanes must be a lane count (int) or a non-empty list of CPU lists, got {lanes!r}"
        )
    cpus = []
    for index, lane in enumerate(lanes):
        if not isinstance(lane, (list, tuple, set, frozenset, range)):
            raise TypeError(f"lanes[{index}] must be a list of CPU ids, got {lane!r}")
        for cpu in lane:
            if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 0:
                raise ValueError(f"lanes[{index}] holds {cpu!r}; CPU ids are ints >= 0")
        cpus.append(sorted(lane))
    return cpus


class AffinityScheduler(_NativeAffinityScheduler):
    """Batches requests by affinity key and runs them on pinned native lanes.

    lanes: a count of unpinned lanes, or one CPU list per lane (``[[0], [1]]``). Where pinning
    is not allowed the lane runs unpinned and a RuntimeWarning says why.
    max_window_s: the longest the adaptive window may hold a batch back to let it grow; it
    waits only while the fitted latency model says larger batches are needed to keep up and
    every queued deadline still holds (at trickle load it never waits).
    """

    def __init__(
        self,
        execute: Callable[[str, list, int], None],
        on_complete: Callable[[int, Optional[str]], None],
        *,
        lanes: Union[int, Sequence[Sequence[int]]] = 1,
        prefetch: Optional[Callable[[str, list, int], None]] = None,
        max_batch_size: int = 8,
        max_batch_bytes: int = 1 << 20,
        queue_capacity: int = 1024,
        max_window_s: float = 0.002,
        target_utilization: float = 0.8,
        placement_slack: int = 8,
        steal_min_queued: int = 2,
    ) -> None:
        if not callable(execute):
            raise TypeError(f"execute must be callable (key, request_ids, lane), got {execute!r}")
        if not callable(on_complete):
            raise TypeError(
                f"on_complete must be callable (request_id, error), got {on_complete!r}"
            )
        if prefetch is not None and not callable(prefetch):
            raise TypeError(f"prefetch must be callable or None, got {prefetch!r}")
        # Only the types are checked here (a bool would pass for an int); the numbers' limits
        # are checked once, by the native scheduler (ValueError naming them).
        for name, value in (("max_batch_size", max_batch_size), ("max_batch_bytes", max_batch_bytes),
                            ("queue_capacity", queue_capacity), ("placement_slack", placement_slack),
                            ("steal_min_queued", steal_min_queued)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        super().__init__(
            execute,
            on_complete,
            prefetch,
            _lane_cpus(lanes),
            max_batch_size,
            max_batch_bytes,
            queue_capacity,
            float(max_window_s),
            float(target_utilization),
            placement_slack,
            steal_min_queued,
        )
        with _open_lock:
            _open_schedulers.add(self)
        for lane, (pinned, why) in enumerate(self.pinning()):
            if not pinned and why:
                warnings.warn(f"scheduler lane {lane} runs unpinned: {why}", RuntimeWarning,
                              stacklevel=2)

    def __enter__(self) -> "AffinityScheduler":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.closed:
            # On an error the queued work is not worth waiting for.
            self.close(drain=exc_type is None)
