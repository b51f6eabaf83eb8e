"""Inputs that were in flight when a model's process died, counted across its crashes.

The supervisor records the digests a dead process was running (flight.read_flights) after each
crash; a model runs an input seen at a crash alone in its batch, and refuses at intake one
that was in flight at `REFUSE_AFTER` crashes, alone at one of them, so one poisonous request
cannot crash-loop it and the requests batched with it are not blamed. The file is small and rewritten whole (written beside,
then renamed), so a reader never sees half of it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Dict, Iterable, Sequence, Set, Tuple

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
    """Crash counts by input digest for one model, kept in `path`.

    A batch that crashes the process blames every input in it, the innocent ones batched with
    the culprit too. So an input seen at a crash becomes a suspect, which the model runs alone
    in its batch from then on (until it has run alone once without a crash); it is refused once
    it was in flight at REFUSE_AFTER crashes and alone in its batch at one of them at least."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.crashes: Dict[str, int] = {}
        self.alone: Dict[str, int] = {}
        try:
            raw = json.loads(self.path.read_text())
            self.crashes = {str(k): int(v) for k, v in raw.get("crashes", {}).items()}
            self.alone = {str(k): int(v) for k, v in raw.get("alone", {}).items()}
        except (OSError, ValueError, AttributeError, TypeError):  # none yet, or not a list of counts: refuse nothing
            self.crashes, self.alone = {}, {}

    def record_crash(self, batches: Iterable[Sequence[bytes]]) -> Set[str]:
        """Count one crash for each input of the batches in flight at it (once each, however
        often it was in flight), and one crash alone for each input that was a batch by itself;
        returns the digests refused from this crash on."""
        batches = [list(batch) for batch in batches]
        before = {d.hex() for d in self.refused()}
        for key in {d.hex() for batch in batches for d in batch}:
            self.crashes[key] = self.crashes.get(key, 0) + 1
        for key in {batch[0].hex() for batch in batches if len(batch) == 1}:
            self.alone[key] = self.alone.get(key, 0) + 1
        if len(self.crashes) > MAX_KEPT:
            keep = sorted(self.crashes, key=lambda k: (-self.alone.get(k, 0), -self.crashes[k]))[:MAX_KEPT]
            self.crashes = {k: self.crashes[k] for k in keep}
            self.alone = {k: n for k, n in self.alone.items() if k in self.crashes}
        self.save()
        return {d.hex() for d in self.refused()} - before

    def refused(self) -> Set[bytes]:
        return {bytes.fromhex(k) for k, n in self.crashes.items() if n >= REFUSE_AFTER and self.alone.get(k, 0) >= 1}

    def suspects(self) -> Set[bytes]:
        """Inputs seen at a crash and not refused: each runs alone in its batch."""
        refused = self.refused()
        return {bytes.fromhex(k) for k in self.crashes} - refused

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        beside = self.path.with_suffix(f".{os.getpid()}.tmp")
        beside.write_text(json.dumps({"refuse_after": REFUSE_AFTER, "crashes": self.crashes, "alone": self.alone}))
        os.replace(beside, self.path)


def refusal_message(model: str) -> str:
    """What a client is told when its input is refused (INVALID_ARG)."""
    return (f"model '{model}' refused this input: it crashed the model twice (in flight at "
            f"{REFUSE_AFTER} deaths of its process, alone in its batch at one); see the server log")
