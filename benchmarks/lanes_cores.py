"""Lanes against inline workers on many cores: does AffinityScheduler's locality pay?

latte.scheduling.AffinityScheduler sends each batch to the lane (a native thread pinned to one
CPU) that last ran its affinity key, so the model's weights and the shape's working set stay
warm in that core's caches. This benchmark measures that claim on a mixed load of two models
built here (nothing is downloaded), each compiled once per shape bucket with TorchScript:

  * enc: a transformer encoder (d_model 128, 4 heads, 2 layers) over sequence buckets 32/64/128,
  * mlp: a 256-512-512-256 MLP over row buckets 32/64/128.

A request picks a model and a bucket (uniformly, seeded); its affinity key is "model/bucket".
torch intra-op threads are set explicitly: OMP/MKL_NUM_THREADS=1 before torch is imported, and
torch.set_num_threads(1) in the main thread, in every lane thread and in every inline worker (the
script checks that each of them sees 1), so each lane or worker uses exactly one core.

Contenders, for each N in --lanes, interleaved within a round (which runs first rotates):
  * inline: N Python worker threads sharing one FIFO queue; a free worker takes the oldest
    request and the oldest waiting requests of the same key, up to --max-batch, and runs them
    at once (no window, no affinity). The workers are not pinned one per core; by default
    (--inline-cpus same) they may run on any of the same N CPUs the lanes get, so both
    contenders use the same cores; --inline-cpus any leaves them on every allowed CPU.
  * lanes-N: AffinityScheduler with lanes [[c] for c in the first N CPUs of
    os.sched_getaffinity(0)], the same --max-batch, max_window_s --window (0 by default, so
    neither side holds batches back and only placement and pinning differ).
An N larger than the allowed CPU count is skipped with a printed line.

Load: a closed loop with a fixed number of requests outstanding (--outstanding per core, 16 by
default: two full batches per core); each answer submits the next request of a seeded key
sequence, the same sequence for both contenders of a round. A closed loop rather than an
open-loop Poisson trace, because (1) the locality claim is about the cost of a batch, which
shows up as throughput at saturation, while an open loop below capacity completes the offered
rate whoever serves it, and above capacity measures only queue growth; (2) a Python load
generator replaying a trace competes with up to N lanes for the GIL, so its lag would shape the
load differently per contender, and in a closed loop the next request is submitted from the
completion callback of whichever contender runs; (3) no capacity probe is needed, so all the
time goes to measurement. With the same outstanding count, mean latency is outstanding /
throughput (Little's law); P99 shows how evenly each contender serves the keys.

Each run: --warmup seconds not counted, then --duration seconds measured (throughput = answers
in the window / window; latency = submit to on_complete of the requests answered in it), then
the loop stops and every outstanding request is drained. Every request must be answered exactly
once and without error; otherwise the script prints what went wrong and exits 1. Reported per
contender (medians over rounds): requests/s, P50/P99 latency, model time per request (the
locality effect itself, without queueing), mean batch size, "key home" (the share of batches
that ran on the lane or worker that last ran their key: the benchmark's own affinity count, the
same for both contenders), "same key" (the lane or worker ran that key in its previous batch),
lane busy (model time / N cores), and for lanes the scheduler's affinity hit rate and steals; per N the ratio lanes-N / inline of throughput and P99 (median of per-round ratios).

    # the many-core run (16 cores; under ~4 minutes), after scripts/gpu_check.sh built latte
    # into build/gpu-site on that machine (docs/gpu.md):
    PYTHONPATH=build/gpu-site python3 benchmarks/lanes_cores.py --lanes 2,4,8 --rounds 3 --duration 6 --json build/lanes.json
    # smoke check on the 2-core box (under a minute):
    .venv/bin/python benchmarks/lanes_cores.py --lanes 1,2 --rounds 1 --duration 1
"""

from __future__ import annotations

import os

# One intra-op thread per lane, never the library default (one per core): set before torch
# loads, and again per thread below (OpenMP's thread count is a per-thread setting).
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, Optional  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from latte.bench.results import Table, Target, command_line, new_results, write_summary  # noqa: E402
from latte.scheduling import AffinityScheduler  # noqa: E402

HERE = Path(__file__).resolve().parent

ENC_FEATURES, ENC_DIM = 32, 128
MLP_FEATURES, MLP_HIDDEN = 256, 512
BUCKETS = {"enc": (32, 64, 128), "mlp": (32, 64, 128)}  # sequence length / rows per request
MODEL_SHARE = {"enc": 0.5, "mlp": 0.5}
DRAIN_LIMIT_S = 60.0


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(ENC_FEATURES, ENC_DIM)
        layer = torch.nn.TransformerEncoderLayer(ENC_DIM, 4, 2 * ENC_DIM, dropout=0.0,
                                                 batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(ENC_DIM, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(1))


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(MLP_FEATURES, MLP_HIDDEN), torch.nn.ReLU(),
            torch.nn.Linear(MLP_HIDDEN, MLP_HIDDEN), torch.nn.ReLU(),
            torch.nn.Linear(MLP_HIDDEN, MLP_FEATURES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).mean(1)


FEATURES = {"enc": ENC_FEATURES, "mlp": MLP_FEATURES}


def build_models(max_batch: int) -> dict[str, tuple[torch.jit.ScriptModule, int, int]]:
    """key -> (frozen TorchScript module for that bucket, bucket, features); one copy of the
    weights per model, shared by every lane and worker, as a server loads a model once."""
    torch.manual_seed(0)
    models = {}
    with torch.inference_mode():
        for name, module in (("enc", Encoder().eval()), ("mlp", Mlp().eval())):
            for bucket in BUCKETS[name]:
                example = torch.randn(2, bucket, FEATURES[name])
                traced = torch.jit.freeze(torch.jit.trace(module, example))
                # Every batch size once or twice, so the executor's optimised plans exist
                # before anything is timed.
                for _ in range(2):
                    for count in range(1, max_batch + 1):
                        traced(torch.randn(count, bucket, FEATURES[name]))
                models[f"{name}/{bucket}"] = (traced, bucket, FEATURES[name])
    return models


def key_sequence(keys: list[str], seed: int, length: int = 1 << 18) -> np.ndarray:
    weights = np.array([MODEL_SHARE[k.split("/")[0]] / len(BUCKETS[k.split("/")[0]]) for k in keys])
    return np.random.default_rng(seed).choice(len(keys), size=length, p=weights / weights.sum())


class ClosedLoop:
    """Issues request ids with their keys and counts the answers: each id exactly once."""

    def __init__(self, keys: list[str], sequence: np.ndarray, models: dict) -> None:
        self._keys, self._sequence, self._models = keys, sequence, models
        self.cv = threading.Condition()
        self.sent: list[float] = []
        self.done: list[float] = []
        self.answers = bytearray()
        self.unknown = 0
        self.answered = 0
        self.errors: collections.Counter = collections.Counter()
        self.stopped = False

    def issue(self) -> Optional[tuple[int, str, int]]:
        """A new request (id, key, size), or None once the loop is stopped."""
        with self.cv:
            if self.stopped:
                return None
            request_id = len(self.sent)
            self.sent.append(time.perf_counter())
            self.done.append(math.nan)
            self.answers.append(0)
        key = self._keys[self._sequence[request_id % len(self._sequence)]]
        return request_id, key, self._models[key][1]

    def answer(self, request_id: int, error: Optional[str]) -> bool:
        """Records an answer; True when it was the first for a known id and succeeded."""
        now = time.perf_counter()
        with self.cv:
            if not 0 <= request_id < len(self.answers):
                self.unknown += 1
                return False
            self.answers[request_id] = min(self.answers[request_id] + 1, 255)
            if self.answers[request_id] != 1:
                return False
            self.done[request_id] = now
            self.answered += 1
            if error is not None:
                self.errors[error.split(":")[0]] += 1
            if self.stopped and self.answered >= len(self.sent):
                self.cv.notify_all()
            return error is None

    def stop_and_drain(self, limit: float) -> bool:
        with self.cv:
            self.stopped = True
            return self.cv.wait_for(lambda: self.answered >= len(self.sent), timeout=limit)

    def problems(self) -> list[str]:
        with self.cv:
            counts = collections.Counter(self.answers)
        out = []
        if counts.get(0):
            out.append(f"{counts[0]} requests never answered")
        twice = sum(n for times, n in counts.items() if times > 1)
        if twice:
            out.append(f"{twice} requests answered more than once")
        if self.unknown:
            out.append(f"{self.unknown} answers for ids never submitted")
        if self.errors:
            out.append(f"{sum(self.errors.values())} requests failed: {dict(self.errors)}")
        return out


class Slots:
    """Per lane / worker: thread setup once per native thread, and the batches it ran."""

    def __init__(self, models: dict, slots: int) -> None:
        self._models = models
        self._lock = threading.Lock()
        self.threads_seen: dict[int, int] = {}  # native thread id -> torch.get_num_threads()
        self.batches: list[list[tuple]] = [[] for _ in range(slots)]
        self._last: list[Optional[str]] = [None] * slots
        self._home: dict[str, int] = {}  # key -> the slot that ran it last

    def setup_thread(self) -> None:
        tid = threading.get_native_id()
        if tid in self.threads_seen:
            return
        torch.set_num_threads(1)
        with self._lock:
            self.threads_seen[tid] = torch.get_num_threads()

    def run(self, slot: int, key: str, count: int) -> None:
        self.setup_thread()
        module, bucket, features = self._models[key]
        last = self._last[slot]
        self._last[slot] = key
        with self._lock:
            home = self._home.get(key)
            self._home[key] = slot
        start = time.perf_counter()
        with torch.inference_mode():
            # A fresh input per batch, as a request's payload arrives.
            module(torch.full((count, bucket, features), 0.5))
        end = time.perf_counter()
        same_model = last is not None and last.split("/")[0] == key.split("/")[0]
        self.batches[slot].append((start, end - start, count, last == key, same_model,
                                   None if home is None else home == slot))


def run_lanes(loop: ClosedLoop, slots: Slots, cpus: list[int], outstanding: int,
              args: argparse.Namespace) -> tuple[dict, Callable[[], None]]:
    box: list[AffinityScheduler] = []

    def submit_next() -> None:
        request = loop.issue()
        if request is not None:
            box[0].submit(request[0], request[1], size=request[2])

    def on_complete(request_id: int, error: Optional[str]) -> None:
        if loop.answer(request_id, error):
            submit_next()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scheduler = AffinityScheduler(
            lambda key, ids, lane: slots.run(lane, key, len(ids)), on_complete,
            lanes=[[c] for c in cpus], max_batch_size=args.max_batch, max_window_s=args.window,
            queue_capacity=max(1024, 2 * outstanding),
        )
    box.append(scheduler)
    info = {"pinning": [[bool(p), w] for p, w in scheduler.pinning()],
            "warnings": [str(w.message) for w in caught]}
    for _ in range(outstanding):
        submit_next()

    def finish(drained: bool) -> None:
        info["metrics"] = scheduler.metrics()
        scheduler.close(drain=drained)

    return info, finish


class InlinePool:
    """N workers, one shared FIFO queue, batches of the head request's key, no affinity."""

    def __init__(self, slots: Slots, workers: int, cpus: Optional[list[int]], max_batch: int,
                 on_done: Callable[[int, Optional[str]], None]) -> None:
        self._slots, self._cpus, self._max_batch, self._on_done = slots, cpus, max_batch, on_done
        self._cv = threading.Condition()
        self._order: collections.deque = collections.deque()  # [id, key, taken]; may hold taken
        self._by_key: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self._stop = False
        self.affinity: list[list[int]] = []
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, request_id: int, key: str) -> None:
        entry = [request_id, key, False]
        with self._cv:
            self._order.append(entry)
            self._by_key[key].append(entry)
            self._cv.notify()

    def _head(self) -> Optional[list]:
        while self._order and self._order[0][2]:
            self._order.popleft()
        return self._order[0] if self._order else None

    def _work(self, index: int) -> None:
        if self._cpus:
            os.sched_setaffinity(0, self._cpus)  # this thread only: may move among these CPUs
        self._slots.setup_thread()
        with self._cv:
            self.affinity.append(sorted(os.sched_getaffinity(0)))
        while True:
            with self._cv:
                while self._head() is None and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                key = self._head()[1]
                same = self._by_key[key]  # untaken requests of the head's key, oldest first
                batch = []
                while same and len(batch) < self._max_batch:
                    entry = same.popleft()
                    entry[2] = True
                    batch.append(entry[0])
            try:
                self._slots.run(index, key, len(batch))
                error = None
            except Exception as exc:  # reported per request, as the scheduler does
                error = f"execute_failed: {type(exc).__name__}: {exc}"
            for request_id in batch:
                self._on_done(request_id, error)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        for thread in self._threads:
            thread.join()


def run_inline(loop: ClosedLoop, slots: Slots, cpus: Optional[list[int]], workers: int,
               outstanding: int, args: argparse.Namespace) -> tuple[dict, Callable[[], None]]:
    box: list[InlinePool] = []

    def submit_next() -> None:
        request = loop.issue()
        if request is not None:
            box[0].submit(request[0], request[1])

    def on_done(request_id: int, error: Optional[str]) -> None:
        if loop.answer(request_id, error):
            submit_next()

    pool = InlinePool(slots, workers, cpus, args.max_batch, on_done)
    box.append(pool)
    info: dict = {}
    for _ in range(outstanding):
        submit_next()

    def finish(drained: bool) -> None:
        pool.close()
        info["worker_cpus"] = pool.affinity

    return info, finish


def percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q, method="higher")) if len(values) else math.nan


def run_one(contender: str, n: int, cpus: list[int], allowed: list[int], models: dict,
            keys: list[str], sequence: np.ndarray, args: argparse.Namespace) -> dict:
    outstanding = args.outstanding * n
    loop = ClosedLoop(keys, sequence, models)
    slots = Slots(models, n)
    load_before = os.getloadavg()[0]
    if contender == "lanes":
        info, finish = run_lanes(loop, slots, cpus, outstanding, args)
    else:
        inline_cpus = cpus if args.inline_cpus == "same" else allowed
        info, finish = run_inline(loop, slots, inline_cpus, n, outstanding, args)
    time.sleep(args.warmup)
    t0 = time.perf_counter()
    time.sleep(args.duration)
    t1 = time.perf_counter()
    drained = loop.stop_and_drain(DRAIN_LIMIT_S)
    finish(drained)
    problems = loop.problems()
    if not drained:
        problems.insert(0, f"not drained within {DRAIN_LIMIT_S:.0f} s")
    seen = set(slots.threads_seen.values())
    if seen != {1}:
        problems.append(f"torch intra-op threads seen in lanes/workers: {sorted(seen)}, not [1]")
    metrics = info.pop("metrics", None)
    if metrics is not None and metrics["completed"] != loop.answered - sum(loop.errors.values()):
        problems.append(f"scheduler counted {metrics['completed']} completed, "
                        f"the loop {loop.answered - sum(loop.errors.values())}")

    sent, done = np.array(loop.sent), np.array(loop.done)
    window = (done >= t0) & (done <= t1)
    latency = done[window] - sent[window]
    batches = [b for lane in slots.batches for b in lane if t0 <= b[0] <= t1]
    model_s = sum(b[1] for b in batches)
    requests = sum(b[2] for b in batches)
    result = {
        "contender": contender, "n": n, "cpus": cpus, "outstanding": outstanding,
        "throughput": float(window.sum()) / (t1 - t0),
        "p50_ms": percentile(latency, 50) * 1e3,
        "p99_ms": percentile(latency, 99) * 1e3,
        "mean_ms": float(latency.mean()) * 1e3 if len(latency) else math.nan,
        "model_us_per_request": model_s / requests * 1e6 if requests else math.nan,
        "mean_batch": requests / len(batches) if batches else math.nan,
        "same_key_rate": sum(b[3] for b in batches) / len(batches) if batches else math.nan,
        "same_model_rate": sum(b[4] for b in batches) / len(batches) if batches else math.nan,
        "key_home_rate": (sum(b[5] for b in seen_before) / len(seen_before)
                          if (seen_before := [b for b in batches if b[5] is not None])
                          else math.nan),
        "lane_busy": model_s / (n * (t1 - t0)),
        "submitted": len(loop.sent), "answered": loop.answered,
        "load_avg_before": load_before,
        "problems": problems,
        **info,
    }
    if metrics is not None:
        result["affinity_hit_rate"] = metrics["affinity_hit_rate"]
        result["steals"] = metrics["steals"]
        result["scheduler_batches"] = metrics["batches"]
    return result


FIELDS = ("throughput", "p50_ms", "p99_ms", "mean_ms", "model_us_per_request", "mean_batch",
          "same_key_rate", "same_model_rate", "key_home_rate", "lane_busy", "affinity_hit_rate",
          "steals")


def median_of(runs: list[dict]) -> dict:
    out = {}
    for field in FIELDS:
        values = [r[field] for r in runs if field in r and not math.isnan(r[field])]
        if values:
            out[field] = float(np.median(values))
    return out


def num(value: Optional[float], spec: str = ".2f") -> str:
    return "n/a" if value is None or math.isnan(value) else format(value, spec)


def pct(value: Optional[float]) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value * 100:.0f}%"


def times(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}x"


def strict(value):
    """NaN -> None throughout, so the JSON file is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) else math.nan


def nan_median(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return float(np.median(kept)) if kept else math.nan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", default="2,4,8", help="lane / worker counts N, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--duration", type=float, default=6.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per run")
    parser.add_argument("--outstanding", type=int, default=16,
                        help="closed loop: requests outstanding per core (lane / worker)")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--window", type=float, default=0.0,
                        help="AffinityScheduler max_window_s (inline never waits)")
    parser.add_argument("--inline-cpus", choices=("same", "any"), default="same",
                        help="inline workers may run on the lanes' N CPUs (same) or on all allowed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write everything to this file")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where lanes-cores.json, the page's input, goes (default: %(default)s)")
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    counts = [int(x) for x in args.lanes.split(",") if x.strip()]
    if not counts or min(counts) < 1 or args.rounds < 1 or args.duration <= 0:
        parser.error("--lanes needs counts >= 1, --rounds >= 1, --duration > 0")

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    allowed = sorted(os.sched_getaffinity(0))
    machine = {
        "cpu_count": os.cpu_count(), "allowed_cpus": len(allowed), "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(), "torch": torch.__version__,
        "numpy": np.__version__, "load_avg": list(os.getloadavg()),
    }
    print(f"machine: {machine['cpu_count']} CPUs ({len(allowed)} allowed), {machine['platform']}, "
          f"Python {machine['python']}, torch {machine['torch']}, load avg "
          + " ".join(f"{x:.2f}" for x in machine["load_avg"]), flush=True)

    runnable, skipped = [], []
    for n in counts:
        if n > len(allowed):
            line = f"skip N={n}: only {len(allowed)} CPUs allowed ({allowed})"
            print(line)
            skipped.append({"n": n, "reason": line})
        else:
            runnable.append(n)

    build_start = time.perf_counter()
    models = build_models(args.max_batch)
    keys = sorted(models)
    print(f"models: {', '.join(keys)} (built in {time.perf_counter() - build_start:.1f} s); "
          f"closed loop, {args.outstanding} outstanding per core; max batch {args.max_batch}; "
          f"window {args.window * 1e3:g} ms; inline CPUs: {args.inline_cpus}; "
          f"{args.rounds} rounds x ({args.warmup:g} s warm-up + {args.duration:g} s)", flush=True)

    runs: list[dict] = []
    failures: list[str] = []
    for round_ in range(args.rounds):
        sequence = key_sequence(keys, args.seed + round_)
        for index, n in enumerate(runnable):
            cpus = allowed[:n]
            order = ["inline", "lanes"]
            if (round_ + index) % 2:
                order.reverse()
            for contender in order:
                result = run_one(contender, n, cpus, allowed, models, keys, sequence, args)
                result["round"] = round_
                runs.append(result)
                label = "inline" if contender == "inline" else f"lanes-{n}"
                print(f"round {round_ + 1}/{args.rounds} N={n} {label:9s} "
                      f"{num(result['throughput'], '8.0f')} req/s  "
                      f"P50 {num(result['p50_ms'], '6.2f')} ms  "
                      f"P99 {num(result['p99_ms'], '6.2f')} ms  "
                      f"model {num(result['model_us_per_request'], '6.0f')} us/req  "
                      f"batch {num(result['mean_batch'])}", flush=True)
                for warning in result.get("warnings", []):
                    print(f"  warning: {warning}")
                for problem in result["problems"]:
                    line = f"round {round_ + 1} N={n} {label}: {problem}"
                    print(f"  ERROR: {problem}", file=sys.stderr)
                    failures.append(line)
                time.sleep(0.2)  # let the last run's threads go

    summary: dict = {}
    print("\n| N | contender | req/s | P50 ms | P99 ms | model us/req | batch | key home "
          "| same key | lane busy | affinity hits | steals |")
    print("|---" * 12 + "|")
    for n in runnable:
        entry = {}
        for contender in ("inline", "lanes"):
            entry[contender] = median_of([r for r in runs if r["n"] == n
                                          and r["contender"] == contender])
            m = entry[contender]
            label = "inline" if contender == "inline" else f"lanes-{n}"
            print(f"| {n} | {label} | {num(m.get('throughput'), '.0f')} | {num(m.get('p50_ms'))} | "
                  f"{num(m.get('p99_ms'))} | {num(m.get('model_us_per_request'), '.0f')} | "
                  f"{num(m.get('mean_batch'))} | "
                  f"{pct(m.get('key_home_rate'))} | {pct(m.get('same_key_rate'))} | "
                  f"{pct(m.get('lane_busy'))} | {pct(m.get('affinity_hit_rate'))} | "
                  f"{num(m.get('steals'), '.0f')} |")
        ratios = {"throughput": [], "p99": [], "model_us_per_request": []}
        for round_ in range(args.rounds):
            pair = {r["contender"]: r for r in runs if r["n"] == n and r["round"] == round_}
            a, b = pair["lanes"], pair["inline"]
            ratios["throughput"].append(ratio(a["throughput"], b["throughput"]))
            ratios["p99"].append(ratio(a["p99_ms"], b["p99_ms"]))
            ratios["model_us_per_request"].append(
                ratio(a["model_us_per_request"], b["model_us_per_request"]))
        entry["ratio_per_round"] = ratios
        entry["ratio"] = {k: nan_median(v) for k, v in ratios.items()}
        summary[str(n)] = entry

    print("\n| N | req/s lanes/inline | P99 ms lanes | P99 ms inline | P99 lanes/inline "
          "| model us/req lanes/inline | per-round req/s ratios |")
    print("|---" * 7 + "|")
    for n in runnable:
        e = summary[str(n)]
        print(f"| {n} | {times(e['ratio']['throughput'])} | {num(e['lanes'].get('p99_ms'))} | "
              f"{num(e['inline'].get('p99_ms'))} | {times(e['ratio']['p99'])} | "
              f"{times(e['ratio']['model_us_per_request'])} | "
              + ", ".join(num(x) for x in e["ratio_per_round"]["throughput"]) + " |")
    print(f"(medians over {args.rounds} round(s); ratios are medians of per-round ratios; "
          f"load avg now " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + ")")

    record = new_results("lanes-cores", "scheduler", f"Pinned lanes against inline workers on {os.cpu_count()} cores",
                         command_line("benchmarks/lanes_cores.py", None, python="PYTHONPATH=build/gpu-site python3"),
                         load_at_start, HERE)
    rows = [[str(n), num(summary[str(n)]["inline"].get("throughput"), ",.0f"),
             num(summary[str(n)]["lanes"].get("throughput"), ",.0f"),
             f"{times(summary[str(n)]['ratio']['throughput'])} ("
             + ", ".join(num(x) for x in summary[str(n)]["ratio_per_round"]["throughput"]) + ")",
             f"{num(summary[str(n)]['inline'].get('p99_ms'))} ms", f"{num(summary[str(n)]['lanes'].get('p99_ms'))} ms",
             times(summary[str(n)]["ratio"]["model_us_per_request"])] for n in runnable]
    best = max((summary[str(n)]["ratio"]["throughput"] for n in runnable), default=float("nan"))
    page = dict(
        summary=(f"Two models, {len(keys)} affinity keys, a closed loop per core, one intra-op thread per lane or "
                 f"worker, {args.rounds} interleaved rounds, medians; ratios are medians of per-round ratios."),
        targets=[Target("pinned lanes ≥ 1.3x inline workers at the same P99 on a mixed load",
                        ", ".join(f"{times(summary[str(n)]['ratio']['throughput'])} ({n} lanes)" for n in runnable),
                        "yes" if best >= 1.3 else "no",
                        why="on CPU a warm cache buys little against the model's own time")],
        tables=[Table("", ["N", "inline req/s", "lanes req/s", "lanes / inline (per round)", "P99 inline",
                           "P99 lanes", "model µs a request, lanes / inline"], rows)])
    print(f"wrote {write_summary(record, page, args.results_dir)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        config.update(keys=keys, model_share=MODEL_SHARE, buckets=BUCKETS)
        args.json.write_text(json.dumps(strict({
            "machine": machine, "config": config, "skipped": skipped, "runs": runs,
            "summary": summary, "failures": failures, "ok": not failures,
            "load_avg_end": list(os.getloadavg()),
        }), indent=1, allow_nan=False))
        print(f"wrote {args.json}")
    if failures:
        print(f"error: {len(failures)} run(s) did not answer every request exactly once "
              f"without error:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
