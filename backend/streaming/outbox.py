"""One response sender's queue. A stream's first output (or its only answer, when it is refused or
fails before it starts) goes ahead of the later outputs of the streams already running: nothing of
that stream can be queued before it, so no stream's outputs leave out of order, and a new stream
does not wait behind the iterations the sender still holds for the others. The queue holds at most
a few iterations, so a slow client side stops the loop instead of filling memory."""

from __future__ import annotations

import itertools
import queue
from typing import List, Optional

FIRST, FOLLOWING, CLOSED = 0, 1, 2   # the order the sender takes them in; equal keys in arrival order


class Outbox:
    def __init__(self, iterations: int) -> None:
        # Each iteration puts at most two parts: its first outputs and its following ones.
        self._queue: "queue.PriorityQueue" = queue.PriorityQueue(maxsize=2 * iterations)
        self._sequence = itertools.count()

    def put(self, emissions: List, first: bool = False) -> None:
        """Blocks while the sender holds its full share of iterations."""
        self._queue.put((FIRST if first else FOLLOWING, next(self._sequence), emissions))

    def close(self) -> None:
        """After every emission already put: the sender stops when it gets None."""
        self._queue.put((CLOSED, next(self._sequence), None))

    def get(self) -> Optional[List]:
        return self._queue.get()[2]
