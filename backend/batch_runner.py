"""The one place a batch meets a model, for every kind of model: `BatchRunner.run` walks the
model's graph on a batch (a plain model's graph is its one model step, a fused model's its
steps, a streaming model's its start or step program) and records what the call did; and
`isolated`, the one rule for a batch that failed.

What the graph's walk guarantees, the runner relies on: every output conformed to its
declared type and holding the batch's rows (ModelStep.run_batch for a model step's call,
Graph for a graph's outputs), a failing step named.
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Deque, Dict, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

import numpy as np

from latte.backend.batching import Batch
from latte.backend.errors import ModelError, OutOfMemory, RequestError, device_out_of_memory

# Records a caller has not taken are dropped past this many (the oldest first), so a runner
# whose caller never takes them (a tool's, a benchmark's) cannot grow without bound.
_MAX_RECORDS = 1 << 16


def failure_text(exc: BaseException) -> str:
    """'Type: the line that says what went wrong' (a TorchScript error opens with a generic line
    and a traceback and ends with the exception raised inside the model)."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    traceback_like = len(lines) > 1 and ("Traceback" in text or "TorchScript" in lines[0])
    first = (lines[-1] if traceback_like else lines[0]) if lines else ""
    if len(first) > 300:
        first = first[:297] + "..."
    return type(exc).__name__ + (f": {first}" if first else "")


def model_failure(model: str, exc: BaseException) -> ModelError:
    """The client's one line for an exception raised by the model: its type and the line that
    says what went wrong. A step of a graph that failed is worded already, with the step."""
    if isinstance(exc, ModelError):
        return ModelError(f"model {model!r}: {exc}", detail=exc.detail)
    return ModelError(f"model {model!r} failed: {failure_text(exc)}", detail=f"{type(exc).__name__}: {str(exc).strip()}")


def out_of_memory(model: str, exc: BaseException) -> Optional[OutOfMemory]:
    """The arena or the device running out of memory, as latte's OutOfMemory (UNAVAILABLE: not
    the request's fault nor the model's); None for any other exception."""
    if isinstance(exc, OutOfMemory):
        return exc
    if isinstance(exc, MemoryError):
        return OutOfMemory(str(exc))
    if device_out_of_memory(exc):
        return OutOfMemory(f"model {model!r}: {failure_text(exc)}")
    return None


def request_failure(model: str, exc: BaseException) -> Exception:
    """What a request that `exc` ended is answered: its own fault as raised, memory that ran
    out as OutOfMemory, anything else as the model's failure."""
    if isinstance(exc, RequestError):
        return exc
    return out_of_memory(model, exc) or model_failure(model, exc)


Member = TypeVar("Member")
Outcome = TypeVar("Outcome")


def isolated(model: str, exc: Exception, members: Sequence[Member],
             alone: Callable[[Member], List[Outcome]],
             failed: Callable[[Member, Exception], Outcome]) -> List[Outcome]:
    """The outcomes of a batch of `members` (requests, or streams) that raised `exc`: memory
    that ran out fails them all (not the model's fault, nor theirs); a member alone fails with
    what it was answered (`failed`); several each run `alone`, so only those the model fails
    on fail and their neighbours go on."""
    memory = out_of_memory(model, exc)
    if memory is not None:
        return [failed(member, memory) for member in members]
    if len(members) == 1:
        return [failed(members[0], request_failure(model, exc))]
    return [outcome for member in members for outcome in alone(member)]


class BatchRecord(NamedTuple):
    """What one model call did, for metrics; the runner appends it as a plain tuple (a call
    on the request path costs more than the record) and take_records names its fields."""
    rows: int
    requests: int
    padded_length: Optional[int]
    seconds: float                # the whole batch: packing, the model call, splitting
    failed: bool
    model_seconds: float = 0.0    # inside the model runtime alone


def _drained(records: Deque[tuple]) -> List[tuple]:
    """Every record in the deque now, taken out; safe while other threads append or take."""
    taken = []
    try:
        while True:
            taken.append(records.popleft())
    except IndexError:
        return taken


class BatchRunner:
    """Runs batches on one graph and records each call, for whoever serves the model to take
    (take_records): the runner records, it calls nothing back. Lanes run batches from their
    own threads; a deque takes their records."""

    def __init__(self, graph, clock: Callable[[], float] = time.monotonic) -> None:
        self.graph = graph
        self.clock = clock
        self.records: Deque[tuple] = collections.deque(maxlen=_MAX_RECORDS)
        self.recording = True  # off while the cost model is timed: timing calls are not traffic

    def run(self, batch: Batch, started: Optional[float] = None
            ) -> Tuple[Dict[str, np.ndarray], Optional[Dict[str, Sequence[int]]]]:
        """The batch through the graph: its outputs, and each row's own length of ragged ones
        where the graph says them; recorded with its members, timed from `started` (when its
        packing began) or from the call. Raises when the model fails; callers isolate what
        failed."""
        called = self.clock()
        outputs, lengths = self.graph.run_batch(batch)
        ran = self.clock()
        if self.recording:
            self.records.append((batch.rows, len(batch.member_rows), batch.padded_length,
                                 ran - (called if started is None else started), False, ran - called))
        return outputs, lengths

    def record_failed(self, batch: Batch, requests: int, started: float) -> None:
        if self.recording:
            self.records.append((batch.rows, requests, batch.padded_length, self.clock() - started, True, 0.0))

    def take_records(self) -> List[BatchRecord]:
        """The records of the batches run since the last take, oldest first."""
        return [BatchRecord(*record) for record in _drained(self.records)]
