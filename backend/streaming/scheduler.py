"""Which streams join this iteration: one `schedule()` per iteration decides (as vLLM's
scheduler does per step). Waiting streams join by priority_level, then arrival, at most
joins_per_iteration at a time and up to max_streams running; a stream that waited past its
timeout_ms is refused instead, and one whose client gave up leaves the queue.

Nothing scans the whole queue each iteration: deadlines are kept in a heap of their own, so
an iteration looks only at those that passed, and streams whose clients gave up are swept out
when the caller has just asked (the runner's cancellation check), or as they reach the head."""

from __future__ import annotations

import heapq
from typing import List, NamedTuple, Optional, Set, Tuple

from latte.backend.streaming.streams import Stream


class Schedule(NamedTuple):
    joins: List[Stream]
    expired: List[Stream]     # waited past their timeout_ms
    cancelled: List[Stream]   # their clients gave up while they waited


def _left(stream: Stream, now: float, expired: List[Stream], cancelled: List[Stream]) -> bool:
    """Whether a waiting stream leaves the queue without joining (its client gave up, or it
    waited past its timeout), added to the list that says which."""
    if stream.cancelled:
        cancelled.append(stream)
    elif now > stream.deadline:
        expired.append(stream)
    else:
        return False
    return True


class StreamScheduler:
    def __init__(self, max_streams: int, joins_per_iteration: int, max_waiting: int) -> None:
        self.max_streams = max_streams
        self.joins_per_iteration = joins_per_iteration
        self.max_waiting = max_waiting
        self._waiting: List[Tuple[int, int, Stream]] = []   # (-priority, number, stream)
        # (deadline, number, stream) of waiting streams with a timeout; an entry whose stream
        # no longer waits is dropped when it reaches the top.
        self._deadlines: List[Tuple[float, int, Stream]] = []
        self._queued: Set[int] = set()                       # numbers of the streams waiting

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def add(self, stream: Stream) -> bool:
        """Queue the stream; False when the queue is full (the caller refuses it)."""
        if len(self._waiting) >= self.max_waiting:
            return False
        heapq.heappush(self._waiting, (-stream.priority, stream.number, stream))
        self._queued.add(stream.number)
        if stream.deadline != float("inf"):
            heapq.heappush(self._deadlines, (stream.deadline, stream.number, stream))
        return True

    def waiting_streams(self) -> List[Stream]:
        return [entry[2] for entry in self._waiting]

    def schedule(self, now: float, running: int, free_blocks: Optional[int] = None,
                 sweep: bool = False) -> Schedule:
        """`running` streams hold state now; `free_blocks`: the cache pool's free blocks (None
        without a cache). A stream joins while each running one keeps a free block for its
        next row; what its prompt needs beyond that is checked when it starts. `sweep`: the
        caller has just marked the streams whose clients gave up, so they leave the queue now."""
        joins: List[Stream] = []
        expired: List[Stream] = []
        cancelled: List[Stream] = []
        room = min(self.joins_per_iteration, self.max_streams - running)
        while self._waiting and len(joins) < room:
            if free_blocks is not None and free_blocks - running - len(joins) <= 0:
                break
            _, _, stream = heapq.heappop(self._waiting)
            self._queued.discard(stream.number)
            if not _left(stream, now, expired, cancelled):
                joins.append(stream)
        passed = False
        while self._deadlines and (self._deadlines[0][0] < now or self._deadlines[0][1] not in self._queued):
            _, number, _ = heapq.heappop(self._deadlines)
            passed = passed or number in self._queued
        if passed or sweep:
            kept = []
            for entry in self._waiting:
                if _left(entry[2], now, expired, cancelled):
                    self._queued.discard(entry[1])
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            self._waiting = kept
        return Schedule(joins, expired, cancelled)

    def drain(self) -> List[Stream]:
        """Every waiting stream, taken out (the model is unloading)."""
        streams = [entry[2] for entry in self._waiting]
        self._waiting, self._deadlines = [], []
        self._queued.clear()
        return streams
