"""What a model's process leaves for `latte serve`, which supervises it, when it was given a
state folder (latte.supervision.state): every call it runs marked in its flight file, inputs
that were in flight at its crashes refused at intake, and its sessions' committed turns kept.

A process given no state folder makes none of this: `for_instance` gives None and the model
runs as it always did.
"""

from __future__ import annotations

import os
import threading
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from latte.backend.errors import RequestError
from latte.backend.requests import Call
from latte.supervision.checkpoint import SessionCheckpoint
from latte.supervision.flight import FlightRecorder
from latte.supervision.poison import PoisonList, input_digest, refusal_message
from latte.supervision.state import flight_path, poison_path, sessions_dir, state_dir


class Vitals:
    """One instance's flight file and the inputs its model refuses. `inputs`: the model's input
    names in the order its config declares them, the order a request's digest takes them in,
    so a request digests alike however its client ordered its tensors."""

    def __init__(self, state, model: str, instance: str, inputs: Sequence[str], logger) -> None:
        self.state, self.model, self.logger = state, model, logger
        self._inputs = list(inputs)
        poisons = PoisonList(poison_path(state, model))
        self.refused, self.suspects = poisons.refused(), poisons.suspects()
        self._cleared = set()   # suspects that ran alone in this process without a crash
        self.recorder = FlightRecorder(flight_path(state, model, instance, os.getpid()))
        self._closed = False

    def intake(self, call: Call, isolate: bool = True) -> List["Part"]:
        """The call in the parts to run one after the other, each marked in flight while it runs:
        every request that crashed the model before refused in its place; with `isolate`, each
        suspect (an input seen at a crash) alone in a part after the others, so that a crash
        blames the input that caused it and not the ones batched with it."""
        digests = self._digests(call)
        if self.refused:
            poisoned = [i for i, digest in enumerate(digests) if digest in self.refused]
            if poisoned:
                call = self._refuse(call, poisoned)
                digests = [None if i in poisoned else d for i, d in enumerate(digests)]
        suspects = [i for i, d in enumerate(digests) if d is not None and d in self.suspects and d not in self._cleared]
        if not suspects or not isolate or call.count == 1:
            alone = digests[0] if suspects and call.count == 1 else None
            return [Part(None, call, [d for d in digests if d is not None], alone)]
        others = [i for i in range(call.count) if i not in set(suspects)]
        running = [i for i in others if digests[i] is not None]
        # Refused requests go with the first part that runs something: a part of refusals alone
        # would be a batch of no rows.
        groups = ([others] if running else []) + [[i] for i in suspects]
        if not running:
            groups[0] = others + groups[0]
        return [Part(group, _members(call, group), [digests[i] for i in group if digests[i] is not None],
                     None if running and k == 0 else digests[group[-1]])
                for k, group in enumerate(groups)]

    def begin(self, part: "Part") -> Optional[int]:
        return self.recorder.begin(part.digests)

    def ran(self, part: "Part") -> None:
        """The part ran without killing the process: its suspect, alone in it, is cleared."""
        if part.suspect is not None:
            self._cleared.add(part.suspect)

    def end(self, slot: Optional[int]) -> None:
        # A lane may answer after finalize closed the file (its sender given up on): nothing to clear.
        if not self._closed:
            self.recorder.end(slot)

    def landing(self, slot: Optional[int], answers: int) -> "Landing":
        return Landing(self, slot, answers)

    def checkpoint(self) -> "KeptSessions":
        return KeptSessions(SessionCheckpoint(sessions_dir(self.state, self.model)), self.model, self.logger)

    def close(self) -> None:
        self._closed = True
        self.recorder.close()

    def _digests(self, call: Call) -> List[Optional[bytes]]:
        """Each request's input digest; None for one refused as it was read (it never runs)."""
        names = self._inputs
        if call.items is None:
            columns = [(name, call.arrays[name]) for name in names]
            return [input_digest([(name, arrays[i]) for name, arrays in columns]) for i in range(call.count)]
        return [None if isinstance(item, Exception)
                else input_digest([(name, item.inputs[name]) for name in names if name in item.inputs])
                for item in call.items]

    def _refuse(self, call: Call, positions: Sequence[int]) -> Call:
        """The call read request by request, the requests at `positions` refused: a refusal is
        answered alone, as any request the reader refused is."""
        items = list(call.items) if call.items is not None else call.requests(range(call.count))
        for position in positions:
            items[position] = RequestError(refusal_message(self.model))
        return Call(call.count, items, call.options)


class Part(NamedTuple):
    """Requests of a call run together: their places in it (None: the whole call), the call
    they make, their digests, and the suspect when one runs alone."""
    positions: Optional[List[int]]
    call: Call
    digests: List[bytes]
    suspect: Optional[bytes]


def _members(call: Call, positions: Sequence[int]) -> Call:
    items = call.items if call.items is not None else call.requests(range(call.count))
    options = [call.options[i] for i in positions] if call.options is not None else None
    return Call(len(positions), [items[i] for i in positions], options)


class Landing:
    """Clears an async call's flight slot once all its `answers` were sent (the sender thread
    counts them off), or at once when the call could not be queued."""

    def __init__(self, vitals: Vitals, slot: Optional[int], answers: int) -> None:
        self._vitals, self._slot, self._left = vitals, slot, answers
        self._lock = threading.Lock()
        if answers <= 0:
            self.abort()

    def sent(self, answers: int) -> None:
        with self._lock:
            self._left -= answers
            done = self._left <= 0
        if done:
            self.abort()

    def abort(self) -> None:
        with self._lock:
            slot, self._slot = self._slot, None
        if slot is not None:
            self._vitals.end(slot)


class KeptSessions:
    """The sessions' checkpoint as the session store uses it: a write that fails (a full disk)
    is logged and the answer still goes out; that session resumes from its last kept turn, or
    not at all, after a restart."""

    def __init__(self, checkpoint: SessionCheckpoint, model: str, logger) -> None:
        self.checkpoint, self.model, self.logger = checkpoint, model, logger

    def load(self):
        return self.checkpoint.load()

    def save(self, session_id: str, prefix: np.ndarray) -> None:
        try:
            self.checkpoint.save(session_id, prefix)
        except OSError as exc:
            self._failed("keeping", session_id, exc)

    def drop(self, session_id: str) -> None:
        try:
            self.checkpoint.drop(session_id)
        except OSError as exc:
            self._failed("dropping", session_id, exc)

    def _failed(self, what: str, session_id: str, exc: OSError) -> None:
        self.logger.log_error(f"latte: {self.model}: {what} session {session_id!r} in "
                              f"{self.checkpoint.folder} failed: {exc}")


def for_instance(args, spec, logger) -> Optional[Vitals]:
    """The instance's vitals when its process was given a state folder, else None."""
    state = state_dir()
    if state is None:
        return None
    name = spec.signature.name
    instance = str(args.get("model_instance_name") or f"{name}_0")
    return Vitals(state, name, instance, [t.name for t in spec.signature.inputs], logger)
