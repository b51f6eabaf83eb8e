"""Where an iteration's emissions wait for a sender thread.

Senders are usually the slower side (each send is a round trip to the server), so the loop runs
ahead of them and each outbox holds a few iterations' outputs of the running streams. A
stream's opening emissions (its first output, or its only answer: refused, expired, cancelled
before it started) go ahead of those: nothing of that stream is queued before them, so they
can, and a newcomer's first token should not wait for the backlog of streams already running.
They go ahead of the rest of a list a sender is sending, too (`openings`, asked between two
sends): its later outputs are posted after its opening, so no list taken before holds them.
Everything else leaves in the order it came, so a stream's outputs keep their order.
"""

from __future__ import annotations

import collections
import threading
from typing import Deque, List, Optional, Tuple

from latte.backend.streaming.engine import Emission

Posted = Optional[List[Emission]]   # None: no more emissions, the sender stops


class Outbox:
    """A bounded queue of emission lists, with openings served first. `put` waits while
    `bound` lists of its kind wait, so a slow client side cannot make outputs pile up in
    memory; openings count apart, so a loop held back by the backlog still posts a first
    output at once."""

    def __init__(self, bound: int) -> None:
        if bound < 1:
            raise ValueError(f"an outbox holds at least one list, got bound={bound}")
        self.bound = bound
        self._opening: Deque[List[Emission]] = collections.deque()
        self._following: Deque[Posted] = collections.deque()
        self._changed = threading.Condition()

    def __len__(self) -> int:
        return len(self._opening) + len(self._following)

    def put(self, emissions: Posted, opening: bool = False) -> None:
        if opening and emissions is None:
            raise ValueError("the end of an outbox follows everything posted before it")
        waiting = self._opening if opening else self._following
        with self._changed:
            while len(waiting) >= self.bound:
                self._changed.wait()
            waiting.append(emissions)
            self._changed.notify_all()

    def get(self) -> Posted:
        with self._changed:
            while not len(self):
                self._changed.wait()
            posted = self._opening.popleft() if self._opening else self._following.popleft()
            self._changed.notify_all()
            return posted

    def openings(self) -> List[Emission]:
        """The openings waiting, taken out now (none: an empty list, at the cost of a length
        read); what a sender sends before the rest of the list in hand."""
        if not self._opening:
            return []
        with self._changed:
            taken = [emission for posted in self._opening for emission in posted]
            self._opening.clear()
            self._changed.notify_all()
        return taken

    def waiting(self) -> Tuple[int, int]:
        """Lists waiting: (openings, the rest)."""
        with self._changed:
            return len(self._opening), len(self._following)
