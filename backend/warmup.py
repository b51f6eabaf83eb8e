"""Synthetic requests run at load, one per shape bucket, before the model reports ready,
and the timings the batch planner's cost model is fitted to."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from latte.backend.config import ModelSpec
from latte.backend.dtypes import is_string
from latte.backend.planning import CostModel
from latte.backend.requests import ParsedRequest


def _ones(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """Ones, not zeros (zero is the usual padding value and may be masked away); text for strings."""
    if is_string(dtype):
        return np.full(shape, b"warm up text", dtype=object)
    return np.ones(shape, dtype=dtype)


def warmup_calls(spec: ModelSpec, samples: Optional[List[Dict[str, np.ndarray]]] = None
                 ) -> List[List[ParsedRequest]]:
    """The calls run at load, shaped as clients send requests (one row each): the runtime's
    own samples (Runtime.samples) as one call when it has them, else one call per shape bucket
    of made-up values, as many one-row requests as a batch holds. A step that reads one row per
    request (as Python models whose clients send one do) then sees what it will serve."""
    if samples:
        return [[ParsedRequest(inputs=sample, rows=1) for sample in samples]]
    count = max(1, spec.signature.max_batch_size) if spec.signature.batched else 1
    return [_one_row_requests(spec, length, count) for length in _warmup_lengths(spec)]


def warmup_shapes(spec: ModelSpec) -> List[Dict[str, tuple]]:
    """The input shapes of a full batch of each warm-up call (a runtime's accuracy check)."""
    rows = max(1, spec.signature.max_batch_size) if spec.signature.batched else 1
    shapes = []
    for length in _warmup_lengths(spec):
        inner = {t.name: tuple(length if d == -1 else d for d in t.dims) for t in spec.signature.inputs
                 if not t.optional}
        shapes.append({name: ((rows,) if spec.signature.batched else ()) + dims for name, dims in inner.items()})
    return shapes


def _warmup_lengths(spec: ModelSpec) -> List[int]:
    lengths = list(spec.serving.bucket_edges or ()) or [spec.serving.max_sequence_length or 8]
    return lengths if any(t.ragged for t in spec.signature.inputs) else lengths[:1]


def _one_row_requests(spec: ModelSpec, length: int, count: int) -> List[ParsedRequest]:
    feed: Dict[str, np.ndarray] = {}
    for t in spec.signature.inputs:
        if t.optional:
            continue
        inner = tuple(length if d == -1 else d for d in t.dims)
        feed[t.name] = _ones((1, *inner) if spec.signature.batched else inner, t.dtype)
    return [ParsedRequest(inputs=feed, rows=1) for _ in range(count)]


def timing_clock(spec: ModelSpec) -> Callable[[], float]:
    """The clock cost timings are taken with. A runtime on one intra-op thread computes on
    the calling thread, so that thread's CPU time is the call's cost without the time slices
    other processes took meanwhile (models load while Triton starts other stubs: wall-clock
    timings then came out up to 4x too high, and the inflated fixed cost merged short
    requests into long padded batches). With more threads, CPU time would miss their work."""
    serving = spec.serving
    return time.thread_time if serving.intra_op_threads == 1 and serving.device == "cpu" else time.perf_counter


# Halvings of the first bucket edge at which a lone request is timed: a request alone runs at
# its own length, and below the first edge nothing else says what that costs (a model whose
# cost is its dense layers costs the same at 4 tokens as at 64; one whose cost is attention
# costs far less).
SHORTER_ONE_ROW_HALVINGS = 4


def shorter_lengths(first_edge: int) -> List[int]:
    return sorted({first_edge >> k for k in range(1, SHORTER_ONE_ROW_HALVINGS + 1) if first_edge >> k >= 1})


def measure_cost_model(engine, repeats: int = 7, rows: int = 16, clock: Optional[Callable[[], float]] = None
                       ) -> Optional[CostModel]:
    """Time, per bucket edge, batches of 1, rows/4, rows/2 and `rows` one-row requests
    through the engine's path for one batch (assembly, model call, splitting; not the
    per-call work that any plan pays once), and one-row calls at shorter lengths
    (shorter_lengths), fastest of `repeats`, and fit the planner's cost model to it.
    None when there is nothing to plan (no buckets, or not batched)."""
    spec = engine.spec
    clock = clock or timing_clock(spec)
    if engine.planner.buckets is None or not spec.signature.batched:
        return None
    if spec.signature.max_batch_size < 2:
        return None  # one row per call: there is no choice to make
    rows = max(2, min(rows, spec.signature.max_batch_size))
    # Timing calls are not served traffic: keep them out of the batch metrics.
    recording, engine.runner.recording = engine.runner.recording, False
    try:
        with exclusive_timing():
            edges = engine.planner.buckets.edges
            shapes = [(edge, size) for edge in edges for size in sorted({1, max(1, rows // 4), max(1, rows // 2), rows})]
            shorter = shorter_lengths(edges[0]) if any(t.ragged for t in spec.signature.inputs) else []
            seconds = _time_shapes(engine, spec, repeats, shapes + [(length, 1) for length in shorter], clock)
    finally:
        engine.runner.recording = recording
    timings: Dict[int, List[Tuple[int, float]]] = {}
    for (length, size), value in seconds.items():
        if length not in shorter:
            timings.setdefault(length, []).append((size, value))
    return CostModel.fit(timings, {length: seconds[(length, 1)] for length in shorter})


@contextlib.contextmanager
def exclusive_timing():
    """Triton loads models in parallel, each latte model in its own stub process; timings
    taken while other models time themselves on the same cores came out several times too
    high (measured: 520-690 us per 128-token row instead of ~150). One model at a time
    times itself, across processes, through an advisory lock file."""
    try:
        import fcntl
    except ImportError:  # not POSIX: time without the lock
        yield
        return
    path = os.path.join(tempfile.gettempdir(), "latte-cost-timing.lock")
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _time_shapes(engine, spec: ModelSpec, repeats: int, shapes: List[Tuple[int, int]], clock: Callable[[], float]
                 ) -> Dict[Tuple[int, int], float]:
    """(length, one-row requests) -> the fastest of `repeats` timings of that batch."""
    batches = {shape: _one_row_requests(spec, *shape) for shape in shapes}
    seconds: Dict[Tuple[int, int], List[float]] = {shape: [] for shape in shapes}
    # Shapes take turns within each repeat, so a burst of load from elsewhere inflates all
    # of them alike instead of one edge's line.
    for _ in range(repeats):
        for shape in shapes:
            # Timed on its second call: the first after another shape's batch runs on caches
            # that batch filled (measured on the sequence encoder: a one-row call took ~3x its
            # warm time right after a 16 x 128 batch), which priced lone requests far too high.
            for timed in (False, True):
                started = clock()
                outcomes = engine.run_batch(batches[shape])
                if timed:
                    seconds[shape].append(clock() - started)
            failed = [o for o in outcomes if isinstance(o, Exception)]
            if failed:
                raise RuntimeError(f"timing the model at length {shape[0]} failed: {failed[0]}")
    # The fastest repeat, not the median: on shared cores a neighbour's time slice lands on
    # long calls more often than on short ones, which bent the median's line upward at the
    # longest edge (measured in tritonserver: 460-690 us per 128-token row, ~150 quiet).
    return {shape: min(values) for shape, values in seconds.items()}
