"""`latte profile`: measure a model's latency curve in-process with latte's own runtimes.

For every shape bucket (one for fixed shapes; several sequence lengths for inputs with a
variable dimension) the batch size doubles from 1 until throughput stops improving,
memory runs short, or one call exceeds the latency ceiling, or would: the next doubling is
skipped once the last one's growth, carried on, passes the ceiling. Each point is warmed
up, then timed call by call for mean, P50 and P99.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from latte.generator.profile_data import Point, Profile, latency_ceiling_ms
from latte.generator.shapes import ModelShapes, resolve_shapes

# A batch must beat the bucket's best throughput by this factor to count as progress.
PROGRESS_GAIN = 1.05
# Sweeps stop after this many batch sizes in a row without progress (one is noise on a busy machine).
PATIENCE = 2


class ProfileRunError(RuntimeError):
    """The model could not be run with the inputs it was given."""


@dataclass
class ProfileOptions:
    runtime: Optional[str] = None              # detected from the file extension when None
    intra_op_threads: int = 1
    device: str = "cpu"
    inputs: Optional[List[dict]] = None        # [{name, data_type, dims}] overriding the detected ones
    max_batch_size: int = 256
    lengths: Optional[List[int]] = None        # shape buckets for variable dimensions
    max_length: Optional[int] = None
    warmup: int = 3
    min_iterations: int = 20
    max_iterations: int = 200
    min_seconds: float = 0.2                   # per point
    max_latency_ms: float = 2000.0             # one call slower than this ends the bucket's sweep
    # With an SLO the ceiling is at most half of it, and the longest bucket, whose curve sets
    # max_batch_size, is swept up to the ceiling even where its throughput has flattened: shorter
    # requests, batched with it, still gain from the larger batches.
    slo_ms: Optional[float] = None
    memory_limit_bytes: Optional[int] = None   # default: 80% of the memory available at start
    seed: int = 0

    @property
    def ceiling_ms(self) -> float:
        return min(self.max_latency_ms, latency_ceiling_ms(self.slo_ms)) if self.slo_ms else self.max_latency_ms


def _status_bytes(field_name: str) -> Optional[int]:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 34


class PeakMemory:
    """Peak resident memory of this process during a block, above the level at its start."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def __enter__(self) -> "PeakMemory":
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            try:
                # "5" resets VmHWM (the peak RSS) to the current RSS (Linux >= 4.0).
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass
            self.start = _status_bytes("VmRSS") or 0
        self.bytes = 0
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            import torch

            self.bytes = max(0, torch.cuda.max_memory_allocated() - self.start)
        else:
            self.bytes = max(0, (_status_bytes("VmHWM") or 0) - self.start)


def _is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower() or "bad_alloc" in str(exc)


def make_feed(shapes: ModelShapes, batch: int, length: Optional[int], rng: np.random.Generator) -> Dict[str, np.ndarray]:
    from latte.backend.samples import sample_values

    if shapes.samples and not shapes.variable:
        # The model's own sample requests, taken in turn to fill the batch.
        count = len(shapes.samples)
        return {t["name"]: np.concatenate([shapes.samples[i % count][t["name"]] for i in range(batch)])
                for t in shapes.inputs}
    feed = {}
    for t in shapes.inputs:
        dims = [length if d == -1 else d for d in t["dims"]]
        if any(d is None for d in dims):
            raise ProfileRunError(f"input {t['name']!r} has a variable dimension; give a length for it")
        lead = [batch] if shapes.batched else []
        feed[t["name"]] = sample_values(t["data_type"], lead + dims, rng)
    return feed


def _time_point(run: Callable, feed: Dict[str, np.ndarray], opts: ProfileOptions) -> List[float]:
    for _ in range(opts.warmup):
        run(feed)
    times: List[float] = []
    started = time.perf_counter()
    while len(times) < opts.max_iterations:
        t0 = time.perf_counter()
        run(feed)
        times.append((time.perf_counter() - t0) * 1000.0)
        if len(times) >= opts.min_iterations and time.perf_counter() - started >= opts.min_seconds:
            break
        if times[-1] > opts.ceiling_ms:
            break
    return times


def predicted_next_ms(points: List[Point]) -> Optional[float]:
    """A floor for the next doubling's mean latency: the last doubling's growth carried on.

    For a cost a + c*b (a, c >= 0) the ratio l(2b)/l(b) only grows with b, so l(b) times
    the last ratio does not overshoot; real curves flatten less, never more, as b grows."""
    if len(points) < 2:
        return None
    last, before = points[-1], points[-2]
    return last.mean_ms * max(1.0, last.mean_ms / before.mean_ms)


def _batch_sizes(limit: int) -> List[int]:
    sizes, b = [], 1
    while b <= limit:
        sizes.append(b)
        b *= 2
    return sizes


def _sweep_bucket(run, shapes, length, opts, memory_limit, rng, advance,
                  to_ceiling: bool = False) -> Tuple[List[Point], str]:
    points: List[Point] = []
    best, stale = 0.0, 0
    sizes = _batch_sizes(opts.max_batch_size if shapes.batched else 1)
    for done, batch in enumerate(sizes):
        feed = make_feed(shapes, batch, length, rng)
        need = sum(a.nbytes for a in feed.values())
        if points and points[-1].peak_bytes * 2 + need > memory_limit:
            advance(len(sizes) - done)
            return points, f"memory: batch {batch} would need about {points[-1].peak_bytes * 2 + need} bytes"
        try:
            with PeakMemory(opts.device) as peak:
                times = _time_point(run, feed, opts)
        except Exception as exc:  # noqa: BLE001 - any runtime failure is reported with its point
            if _is_out_of_memory(exc):
                advance(len(sizes) - done)
                return points, f"memory: batch {batch} ran out of memory ({exc})"
            raise ProfileRunError(f"the model failed at batch {batch}"
                                  f"{'' if length is None else f', length {length}'}: {exc}") from exc
        arr = np.asarray(times)
        point = Point(batch_size=batch, length=length, mean_ms=float(arr.mean()),
                      p50_ms=float(np.percentile(arr, 50)), p99_ms=float(np.percentile(arr, 99)),
                      peak_bytes=int(max(peak.bytes, need)))
        points.append(point)
        advance(1)
        if point.mean_ms > opts.ceiling_ms:
            advance(len(sizes) - done - 1)
            return points, f"latency: one call at batch {batch} took {point.mean_ms:.0f} ms"
        ahead = predicted_next_ms(points)
        if done + 1 < len(sizes) and ahead is not None and ahead > opts.ceiling_ms:
            advance(len(sizes) - done - 1)
            return points, (f"latency: batch {sizes[done + 1]} would take at least {ahead:.0f} ms, over the "
                            f"{opts.ceiling_ms:g} ms ceiling")
        if point.throughput >= best * PROGRESS_GAIN:
            best, stale = point.throughput, 0
        else:
            stale += 1
            if stale >= PATIENCE and not to_ceiling:
                advance(len(sizes) - done - 1)
                return points, (f"throughput: no gain of {PROGRESS_GAIN - 1:.0%} over {best:.0f} rows/s for "
                                f"{PATIENCE} doublings")
    return points, "limit: reached --max-batch-size" if shapes.batched else "the model does not batch"


def served_call(runtime, length: Optional[int]):
    """The runtime called as a served batch is (`run_batch`: one-row requests of `length` each),
    so that a profile times what serving runs, a graph's steps with the lengths they are told."""
    from latte.backend.batching import Batch

    def call(feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        rows = len(next(iter(feed.values())))
        lengths = None if length is None else np.full(rows, length, dtype=np.int64)
        return runtime.run_batch(Batch(inputs=feed, member_rows=[1] * rows, lengths=lengths,
                                       padded_length=length, rows=rows))[0]
    return call


def profile_model(model_file: Path, opts: Optional[ProfileOptions] = None, show_progress: bool = False) -> Profile:
    """Measure latency and memory per batch size and shape bucket; returns the Profile."""
    from latte.backend import memory_resource
    from latte.backend.runtimes import load_runtime

    # A graph's steps make their buffers from the current resource; the profile measures the
    # model itself, and the arena is sized from what the profile finds, so none is made here.
    memory_resource.use_numpy("a profile times the model, and sizes the arena from what it finds")
    opts = opts or ProfileOptions()
    model_file = Path(model_file)
    if not model_file.exists():
        raise FileNotFoundError(f"model file {model_file} does not exist")
    if opts.intra_op_threads < 1:
        raise ValueError(f"intra_op_threads must be >= 1, got {opts.intra_op_threads}")
    shapes = resolve_shapes(model_file, opts.runtime, opts.inputs, opts.max_length)
    started = time.perf_counter()
    runtime = load_runtime(shapes.runtime, model_file, [t["name"] for t in shapes.inputs],
                           [t["name"] for t in shapes.outputs], opts.intra_op_threads, 1, opts.device)
    shapes.samples = runtime.samples()
    rng = np.random.default_rng(opts.seed)
    memory_limit = opts.memory_limit_bytes or int(available_memory() * 0.8)
    if shapes.variable:
        top = shapes.max_length
        buckets = sorted(set(opts.lengths or [n for n in (8, 16, 32, 64, 128, 256, 512, 1024) if n < top] + [top]))
    else:
        buckets = [None]

    # The first call fixes unknown output shapes (TorchScript files carry none).
    first = served_call(runtime, buckets[0])(make_feed(shapes, 1, buckets[0], rng))
    outputs = []
    for t in shapes.outputs:
        value = np.asarray(first[t["name"]])
        dims = list(value.shape[1:] if shapes.batched else value.shape)
        from latte.backend.dtypes import to_triton

        outputs.append({"name": t["name"], "data_type": to_triton(value.dtype),
                        "dims": t["dims"] if t.get("dims") else dims})

    points: List[Point] = []
    reasons: Dict[str, str] = {}
    total = len(buckets) * len(_batch_sizes(opts.max_batch_size if shapes.batched else 1))
    progress = None
    if show_progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("profiling {task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn())
        progress.start()
        task = progress.add_task(model_file.name, total=total)
    try:
        for length in buckets:
            advance = (lambda n: progress.advance(task, n)) if progress else (lambda n: None)
            bucket_points, reason = _sweep_bucket(served_call(runtime, length), shapes, length, opts, memory_limit,
                                                  rng, advance,
                                                  to_ceiling=bool(opts.slo_ms) and length == buckets[-1])
            points.extend(bucket_points)
            reasons["fixed" if length is None else str(length)] = reason
    finally:
        if progress:
            progress.stop()
        runtime.close()
    return Profile(model_file=str(model_file), runtime=shapes.runtime, device=opts.device,
                   intra_op_threads=opts.intra_op_threads, inputs=shapes.inputs, outputs=outputs, points=points,
                   wall_s=time.perf_counter() - started, stop_reason=reasons, max_latency_ms=opts.ceiling_ms)
