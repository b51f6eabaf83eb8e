"""What a model's process is running now, kept in a file that outlives the process.

The model marks each batch it runs: when it started (CLOCK_MONOTONIC, the same clock in every
process of the machine) and a digest of each request's inputs. The supervisor reads the file
of every live instance a few times a second: a batch running past the model's limit means a
hung instance; the digests of a process that died are the inputs it was running when it did.

The file is memory-mapped: marking a batch is a few stores, no system call. A slot's digests
are written before its start time, and its start time is cleared last, so a reader that sees a
start time sees the digests that go with it.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence

MAGIC = b"LATTEFL1"
SLOTS = 16            # batches in flight at once in one process (lanes, async calls)
MAX_DIGESTS = 256     # requests of one batch whose digests are kept
DIGEST_BYTES = 16
_HEADER = struct.Struct("<8sQII")  # magic, pid, slots, max digests
_HEADER_BYTES = 64
_SLOT_HEAD = struct.Struct("<QI")  # started (ns, 0 when free), digests
_SLOT_BYTES = _SLOT_HEAD.size + 4 + MAX_DIGESTS * DIGEST_BYTES
FILE_BYTES = _HEADER_BYTES + SLOTS * _SLOT_BYTES


class Flight(NamedTuple):
    """A batch in flight: since when (monotonic seconds) and its requests' input digests."""
    started_s: float
    digests: List[bytes]


class FlightRecorder:
    """The writing side, one per model process. `begin` marks a batch and gives its slot (None
    when every slot is taken: that batch goes unmarked); `end` clears it."""

    def __init__(self, path: Path, pid: Optional[int] = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, FILE_BYTES)
            self._map = mmap.mmap(fd, FILE_BYTES)
        finally:
            os.close(fd)
        _HEADER.pack_into(self._map, 0, MAGIC, pid if pid is not None else os.getpid(), SLOTS, MAX_DIGESTS)
        self._free = list(range(SLOTS - 1, -1, -1))
        self._lock = threading.Lock()

    def begin(self, digests: Sequence[bytes]) -> Optional[int]:
        with self._lock:
            if not self._free:
                return None
            slot = self._free.pop()
        offset = _HEADER_BYTES + slot * _SLOT_BYTES
        kept = list(digests)[:MAX_DIGESTS]
        body = offset + _SLOT_HEAD.size + 4
        for i, digest in enumerate(kept):
            self._map[body + i * DIGEST_BYTES: body + (i + 1) * DIGEST_BYTES] = digest[:DIGEST_BYTES].ljust(DIGEST_BYTES, b"\0")
        struct.pack_into("<I", self._map, offset + 8, len(kept))
        struct.pack_into("<Q", self._map, offset, time.monotonic_ns() or 1)
        return slot

    def end(self, slot: Optional[int]) -> None:
        if slot is None:
            return
        struct.pack_into("<Q", self._map, _HEADER_BYTES + slot * _SLOT_BYTES, 0)
        with self._lock:
            self._free.append(slot)

    def close(self, remove: bool = True) -> None:
        try:
            self._map.close()
        finally:
            if remove:
                try:
                    self.path.unlink()
                except FileNotFoundError:
                    pass


def read_flights(path: Path) -> List[Flight]:
    """The batches a process's file says are in flight (none for a missing or foreign file)."""
    try:
        data = Path(path).read_bytes()
    except (FileNotFoundError, PermissionError):
        return []
    if len(data) < FILE_BYTES:
        return []
    magic, _pid, slots, max_digests = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or slots != SLOTS or max_digests != MAX_DIGESTS:
        return []
    flights = []
    for slot in range(SLOTS):
        offset = _HEADER_BYTES + slot * _SLOT_BYTES
        started, count = _SLOT_HEAD.unpack_from(data, offset)
        if not started:
            continue
        body = offset + _SLOT_HEAD.size + 4
        count = min(count, MAX_DIGESTS)
        flights.append(Flight(started / 1e9, [data[body + i * DIGEST_BYTES: body + (i + 1) * DIGEST_BYTES]
                                              for i in range(count)]))
    return flights


def longest_running_s(flights: Sequence[Flight], now_s: Optional[float] = None) -> float:
    """How long the oldest batch in flight has run, 0 when none runs."""
    if not flights:
        return 0.0
    now_s = time.monotonic() if now_s is None else now_s
    return max(0.0, now_s - min(f.started_s for f in flights))
