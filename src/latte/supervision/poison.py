"""Inputs that were in flight when a model's process died, counted across its crashes.

The supervisor records the digests a dead process was running (flight.read_flights) after each
crash; a model refuses at intake an input that was in flight at `REFUSE_AFTER` crashes, so one
poisonous request cannot crash-loop it. The file is small and rewritten whole (written beside,
then renamed), so a reader never sees half of it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Dict, Iterable, Set, Tuple

import numpy as np

REFUSE_AFTER = 2
# Digests kept at most: an input seen at one crash only is forgotten first.
MAX_KEPT = 4096


def input_digest(inputs: Iterable[Tuple[str, np.ndarray]]) -> bytes:
    """16 bytes that tell one request's inputs apart: names, dtypes, shapes and bytes."""
    h = hashlib.blake2b(digest_size=16)
    for name, array in inputs:
        array = np.asarray(array)
        h.update(name.encode())
        h.update(str(array.dtype).encode())
        h.update(repr(array.shape).encode())
        if array.dtype == object:
            for item in array.reshape(-1):
                h.update(item if isinstance(item, bytes) else str(item).encode())
                h.update(b"\0")
        else:
            h.update(np.ascontiguousarray(array).data)
    return h.digest()


class PoisonList:
    """Crash counts by input digest for one model, kept in `path`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.crashes: Dict[str, int] = {}
        try:
            raw = json.loads(self.path.read_text())
            self.crashes = {str(k): int(v) for k, v in raw.get("crashes", {}).items()}
        except (OSError, ValueError, AttributeError, TypeError):  # none yet, or not a list of counts: refuse nothing
            pass

    def record_crash(self, digests: Iterable[bytes]) -> Set[str]:
        """Count one crash for each digest (once each, however often it was in flight); returns
        the digests that reached REFUSE_AFTER with this crash."""
        newly = set()
        for key in {d.hex() for d in digests}:
            self.crashes[key] = self.crashes.get(key, 0) + 1
            if self.crashes[key] == REFUSE_AFTER:
                newly.add(key)
        if len(self.crashes) > MAX_KEPT:
            keep = sorted(self.crashes.items(), key=lambda kv: -kv[1])[:MAX_KEPT]
            self.crashes = dict(keep)
        self.save()
        return newly

    def refused(self) -> Set[bytes]:
        return {bytes.fromhex(k) for k, n in self.crashes.items() if n >= REFUSE_AFTER}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        beside = self.path.with_suffix(f".{os.getpid()}.tmp")
        beside.write_text(json.dumps({"refuse_after": REFUSE_AFTER, "crashes": self.crashes}))
        os.replace(beside, self.path)


def refusal_message(model: str) -> str:
    """What a client is told when its input is refused (INVALID_ARG)."""
    return (f"model '{model}' refused this input: it crashed the model twice (in flight at "
            f"{REFUSE_AFTER} deaths of its process); see the server log")
