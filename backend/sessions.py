"""Per-session state with an idle TTL, so abandoned sessions cannot pile up.

A session holds the token prefix seen so far for the model's `session_input`; each
request of the session is run on prefix + its own tokens, and the combined sequence
becomes the new prefix. Sessions end explicitly (session_end) or when idle for `ttl_s`.

Where a model's process is given a state folder, each committed prefix is also kept by a
checkpoint (supervision.checkpoint.SessionCheckpoint), so that a restarted process resumes
its sessions: the store tells it every change as it makes it, under its lock, so the files
follow the sessions in the order they changed.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, NamedTuple, Optional, Protocol

import numpy as np

from latte.backend import memory_resource
from latte.backend.errors import RequestError


@dataclass
class Session:
    prefix: np.ndarray
    last_used: float
    requests: int = 0


@dataclass
class SessionStats:
    live: int = 0
    started: int = 0
    ended: int = 0
    expired: int = 0


class Turn(NamedTuple):
    """One request of a session on its way through the model: the sequence it runs (the
    session's prefix and its own tokens), settled by `commit` once answered or `release` if not."""
    session_id: str
    number: int
    sequence: np.ndarray
    start: bool
    end: bool


class Checkpoint(Protocol):
    """Where sessions' committed prefixes outlive the process (SessionCheckpoint)."""

    def save(self, session_id: str, prefix: np.ndarray) -> None: ...

    def drop(self, session_id: str) -> None: ...


class _InFlight(NamedTuple):
    number: int
    since: float
    start: bool


class SessionStore:
    """Sessions by id. A session has at most one turn in flight: its next request comes after
    that one's answer, as each turn runs on the prefix the one before it left. A session being
    started counts against `max_sessions` from its first turn, not its first answer."""

    def __init__(self, ttl_s: float, max_sessions: int, max_length: Optional[int],
                 clock: Callable[[], float] = time.monotonic, checkpoint: Optional[Checkpoint] = None) -> None:
        if ttl_s <= 0:
            raise ValueError(f"session TTL must be > 0 seconds, got {ttl_s}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.max_length = max_length
        self._clock = clock
        self.checkpoint = checkpoint
        self._sessions: Dict[str, Session] = {}
        self._turns: Dict[str, _InFlight] = {}
        self._starting = 0  # turns in flight that open a session
        self._numbers = itertools.count(1)
        self._stats = SessionStats()
        self._lock = threading.Lock()

    def reap(self) -> int:
        """Drop sessions idle for longer than the TTL; returns how many. A session with a turn in
        flight is not idle. A turn in flight for longer than the TTL is forgotten, so that a
        turn never settled cannot hold its session shut; its session, idle as long, goes with it."""
        now = self._clock()
        with self._lock:
            for key in [key for key, t in self._turns.items() if now - t.since > self.ttl_s]:
                self._forget(key)
            expired = [key for key, s in self._sessions.items()
                       if now - s.last_used > self.ttl_s and key not in self._turns]
            for key in expired:
                del self._sessions[key]
                self._dropped(key)
            self._stats.expired += len(expired)
            return len(expired)

    def restore(self, sessions: Mapping[str, np.ndarray]) -> int:
        """Open the sessions a process before this one committed (id -> prefix), each as if just
        used; past `max_sessions`, the rest are dropped. Returns how many were opened."""
        now = self._clock()
        with self._lock:
            for key, prefix in sessions.items():
                if key in self._sessions:
                    continue
                if len(self._sessions) >= self.max_sessions:
                    self._dropped(key)
                    continue
                self._sessions[key] = Session(prefix=prefix, last_used=now)
            return len(self._sessions)

    def extend(self, session_id: str, tokens: np.ndarray, start: bool, end: bool = False) -> Turn:
        """The turn of this request: the session's prefix followed by `tokens` (1 x n), in flight
        until it is settled."""
        if tokens.ndim != 2 or tokens.shape[0] != 1:
            raise RequestError(f"session requests carry one sequence (1 row); got shape {list(tokens.shape)}")
        self.reap()
        with self._lock:
            if session_id in self._turns:
                raise RequestError(f"session {session_id!r} has a request in flight; send its next request "
                                   "after that one's answer")
            session = self._sessions.get(session_id)
            if session is None and not start:
                raise RequestError(
                    f"unknown session {session_id!r}: it was never started (session_start: true), "
                    f"ended, or idle for more than {self.ttl_s:g} s"
                )
            if session is not None and start:
                raise RequestError(f"session {session_id!r} is already open; send session_start only once")
            if session is None and len(self._sessions) + self._starting >= self.max_sessions:
                raise RequestError(f"too many open sessions ({self.max_sessions}); end some or wait for the TTL")
            prefix = session.prefix if session is not None else tokens[0, :0]
            total = prefix.shape[0] + tokens.shape[1]
            if self.max_length is not None and total > self.max_length:
                raise RequestError(
                    f"session {session_id!r} would reach {total} tokens; the model takes at most {self.max_length} "
                    f"(end the session and start a new one)"
                )
            combined = memory_resource.empty((1, total), tokens.dtype)
            combined[0, :prefix.shape[0]] = prefix
            combined[0, prefix.shape[0]:] = tokens[0]
            number = next(self._numbers)
            self._turns[session_id] = _InFlight(number, self._clock(), start)
            self._starting += start
        return Turn(session_id, number, combined, start, end)

    def commit(self, turn: Turn) -> None:
        """The turn was answered: its sequence becomes the session's prefix, or the session
        ends. A turn forgotten past the TTL left with its session (reap drops both at once), so
        its late answer opens the session again from its sequence, while `max_sessions` has room
        and no session of that id was started or is in flight meanwhile; one that would open a
        session opens none."""
        with self._lock:
            if not self._settle(turn) and (turn.start or turn.session_id in self._turns
                                           or turn.session_id in self._sessions
                                           or len(self._sessions) + self._starting >= self.max_sessions):
                return
            if turn.end:
                if self._sessions.pop(turn.session_id, None) is not None:
                    self._stats.ended += 1
                    self._dropped(turn.session_id)
                return
            existing = self._sessions.get(turn.session_id)
            if existing is None:
                self._stats.started += 1
                self._sessions[turn.session_id] = Session(prefix=turn.sequence[0], last_used=self._clock(), requests=1)
            else:
                existing.prefix = turn.sequence[0]
                existing.last_used = self._clock()
                existing.requests += 1
            if self.checkpoint is not None:
                self.checkpoint.save(turn.session_id, turn.sequence[0])

    def release(self, turn: Turn) -> None:
        """The turn failed or was never run: its session stays as it was (a start opens none)."""
        with self._lock:
            self._settle(turn)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._turns)

    def _settle(self, turn: Turn) -> bool:
        current = self._turns.get(turn.session_id)
        if current is None or current.number != turn.number:
            return False
        self._forget(turn.session_id)
        return True

    def _dropped(self, session_id: str) -> None:
        if self.checkpoint is not None:
            self.checkpoint.drop(session_id)

    def _forget(self, session_id: str) -> None:
        self._starting -= self._turns.pop(session_id).start

    def stats(self) -> SessionStats:
        with self._lock:
            return SessionStats(live=len(self._sessions), started=self._stats.started,
                                ended=self._stats.ended, expired=self._stats.expired)
