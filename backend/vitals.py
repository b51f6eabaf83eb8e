"""What a model's process leaves for `latte serve`, which supervises it, when it was given a
state folder (latte.supervision.state): every call it runs marked in its flight file, inputs
that were in flight at its crashes refused at intake, and its sessions' committed turns kept.

A process given no state folder makes none of this: `for_instance` gives None and the model
runs as it always did.
"""

from __future__ import annotations

import os
import threading
from typing import List, Optional, Sequence, Tuple

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
        self.refused = PoisonList(poison_path(state, model)).refused()
        self.recorder = FlightRecorder(flight_path(state, model, instance, os.getpid()))
        self._closed = False

    def intake(self, call: Call) -> Tuple[Call, Optional[int]]:
        """The call with each request that crashed the model before refused in its place, and
        the flight slot that marks the rest running (None when every slot is taken)."""
        digests = self._digests(call)
        refused = self.refused
        if refused:
            poisoned = [i for i, digest in enumerate(digests) if digest in refused]
            if poisoned:
                call = self._refuse(call, poisoned)
        return call, self.recorder.begin([d for d in digests if d is not None and d not in refused])

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
