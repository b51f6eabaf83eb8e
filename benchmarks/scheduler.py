"""Scheduler benchmark: latte.scheduling against a FIFO + fixed-window batcher (Triton-like) and
round-robin placement, on one open-loop request trace per scenario, in the same run.

The model is a small TorchScript transformer encoder with one compiled module per shape bucket.
Its cost depends on locality, as it does in a real server:
  * each lane (worker) keeps the compiled modules of a few buckets; a cold bucket is loaded
    with torch.jit.load (deserialise + first optimised runs),
  * session requests continue a conversation whose state lives on the lane that ran the last
    turn; elsewhere the state is rebuilt by re-encoding the session's history.

    .venv/bin/python benchmarks/scheduler.py            # ~4 minutes on 2 cores
    .venv/bin/python benchmarks/scheduler.py --rounds 1 --scenarios poisson   # quick look
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch

from latte.bench.quiet import wait_until_quiet
from latte.bench.results import Table, Target, command_line, new_results, write_summary
from latte.scheduling import AffinityScheduler

BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128)  # sequence lengths, Zipf-popular from the left
ZIPF_S = 1.1
FEATURES = 32
SESSION_BUCKET = 32
SESSIONS = 40
SESSION_SHARE = 0.25
HIGH_SHARE = 0.2
SLO_S = {1: 0.030, 0: 0.120}  # P99 targets: priority 1 (high), priority 0 (low)
MAX_BATCH = 8
WINDOW_S = 0.002
KERNELS_PER_LANE = 5
SESSIONS_PER_LANE = 16


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(FEATURES, 64)
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(1))


def compile_buckets() -> dict[int, bytes]:
    """One frozen TorchScript module per bucket, serialised: what a lane loads when cold."""
    torch.manual_seed(0)
    model = Encoder().eval()
    compiled = {}
    with torch.inference_mode():
        for length in BUCKETS:
            traced = torch.jit.freeze(torch.jit.trace(model, torch.randn(1, length, FEATURES)))
            buffer = io.BytesIO()
            torch.jit.save(traced, buffer)
            compiled[length] = buffer.getvalue()
    return compiled


_thread_setup = threading.local()


class LocalityModel:
    """Runs batches; per-lane caches make the cost of a batch depend on where it runs."""

    def __init__(self, compiled: dict[int, bytes], lanes: int) -> None:
        self._compiled = compiled
        self._kernels = [collections.OrderedDict() for _ in range(lanes)]
        self._states = [collections.OrderedDict() for _ in range(lanes)]
        self._lock = threading.Lock()  # session ownership is shared between lanes
        self._session_owner: dict[int, int] = {}
        self._session_turns: collections.Counter = collections.Counter()
        self.batches = 0
        self.warm_batches = 0

    def _kernel(self, lane: int, length: int) -> tuple[torch.jit.ScriptModule, bool]:
        cache = self._kernels[lane]
        if length in cache:
            cache.move_to_end(length)
            return cache[length], True
        module = torch.jit.load(io.BytesIO(self._compiled[length]))
        cache[length] = module
        if len(cache) > KERNELS_PER_LANE:
            cache.popitem(last=False)
        return module, False

    def run(self, lane: int, key: str, count: int) -> None:
        if not getattr(_thread_setup, "done", False):
            # Workers yield to the load generator, which shares their two cores: a starved
            # generator would submit late and shape the load instead of the trace.
            _thread_setup.done = True
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + 3)
        with torch.inference_mode():
            if key.startswith("s"):
                self._run_session(lane, int(key[1:]), count)
                return
            length = int(key[1:])
            module, warm = self._kernel(lane, length)
            module(torch.randn(count, length, FEATURES))
            with self._lock:
                self.batches += 1
                self.warm_batches += warm

    def _run_session(self, lane: int, session: int, count: int) -> None:
        module, warm = self._kernel(lane, SESSION_BUCKET)
        with self._lock:
            fresh = self._session_owner.get(session) == lane
            turns = self._session_turns[session]
        states = self._states[lane]
        if not (fresh and session in states):
            # Rebuild the conversation state from its history, one turn per chunk.
            history = min(turns, 8)
            states[session] = (
                module(torch.randn(history, SESSION_BUCKET, FEATURES)).mean(0)
                if history
                else torch.zeros(16)
            )
            warm = warm and history == 0
        states.move_to_end(session)
        if len(states) > SESSIONS_PER_LANE:
            states.popitem(last=False)
        out = module(torch.randn(count, SESSION_BUCKET, FEATURES))
        states[session] = 0.9 * states[session] + 0.1 * out.mean(0)
        with self._lock:
            self._session_owner[session] = lane
            self._session_turns[session] += count
            self.batches += 1
            self.warm_batches += warm

    def warm_rate(self) -> float:
        with self._lock:
            return self.warm_batches / max(self.batches, 1)


@dataclass
class Request:
    id: int
    key: str
    priority: int
    size: int
    arrival: float  # seconds from the start of the trace
    # When the replay submitted it; latency counts from here, as a server measures it. The replay
    # lags the trace when the cores are contended, and the lag is reported beside the results.
    sent: float = 0.0
    enqueued: float = 0.0  # baselines: when it entered their queue
    taken: bool = False  # baselines: already part of a batch
    done: Optional[float] = None
    error: Optional[str] = None


def make_trace(rng: np.random.Generator, rate_at: Callable[[float], float], duration: float,
               cv: float) -> list[Request]:
    """Open-loop arrivals: Poisson (cv=1) or Gamma-distributed gaps with the given CV."""
    shape = 1.0 / (cv * cv)
    weights = 1.0 / np.arange(1, len(BUCKETS) + 1) ** ZIPF_S
    weights /= weights.sum()
    requests, t = [], 0.0
    while True:
        rate = rate_at(t)
        t += rng.gamma(shape, 1.0 / (rate * shape))
        if t >= duration:
            return requests
        if rng.random() < SESSION_SHARE:
            key, size = f"s{rng.integers(SESSIONS)}", SESSION_BUCKET
        else:
            size = int(rng.choice(BUCKETS, p=weights))
            key = f"b{size}"
        priority = int(rng.random() < HIGH_SHARE)
        requests.append(Request(len(requests), key, priority, size, t))


def replay(trace: list[Request], submit: Callable[[Request], None]) -> float:
    """Submits each request at its arrival time; returns the start time."""
    start = time.perf_counter()
    for request in trace:
        delay = request.arrival - (time.perf_counter() - start)
        if delay > 0:
            time.sleep(delay)
        request.sent = time.perf_counter() - start
        submit(request)
    return start


def wait_done(trace: list[Request], pending: threading.Condition, counter: list[int],
              limit: float) -> None:
    with pending:
        pending.wait_for(lambda: counter[0] >= len(trace), timeout=limit)


def run_latte(trace: list[Request], model: LocalityModel, lanes: list[list[int]]) -> dict:
    by_id = {r.id: r for r in trace}
    pending, finished, start = threading.Condition(), [0], [0.0]

    def execute(key: str, ids: list, lane: int) -> None:
        model.run(lane, key, len(ids))

    def on_complete(request_id: int, error: Optional[str]) -> None:
        request = by_id[request_id]
        request.done = time.perf_counter() - start[0]
        request.error = error
        with pending:
            finished[0] += 1
            pending.notify_all()

    scheduler = AffinityScheduler(
        execute, on_complete, lanes=lanes, max_batch_size=MAX_BATCH, max_window_s=WINDOW_S,
        queue_capacity=256,
    )
    start[0] = time.perf_counter()
    replay_start = replay(trace, lambda r: scheduler.submit(
        r.id, r.key, priority=r.priority, timeout_s=SLO_S[r.priority], size=r.size))
    start[0] = replay_start
    wait_done(trace, pending, finished, 60)
    metrics = scheduler.metrics()
    scheduler.close(drain=False)
    return metrics


class _FifoQueue:
    """Arrival order plus a per-key index, so forming a batch costs O(batch), not O(queue)."""

    def __init__(self) -> None:
        self.order: collections.deque = collections.deque()  # may hold taken requests
        self.by_key: dict[str, collections.deque] = collections.defaultdict(collections.deque)

    def head(self) -> Optional[Request]:
        while self.order and self.order[0].taken:
            self.order.popleft()
        return self.order[0] if self.order else None


class FixedWindowBatcher:
    """Triton-like dynamic batching: FIFO queues, no priorities or deadlines, and a batch leaves
    when it is full or the oldest request has waited the fixed window. round_robin=False is one
    queue shared by all workers; True gives each worker its own queue, filled in turn."""

    def __init__(self, model: LocalityModel, lanes: list[list[int]], round_robin: bool,
                 on_done: Callable[[Request], None]) -> None:
        self._model, self._on_done = model, on_done
        self._queues = [_FifoQueue() for _ in (lanes if round_robin else [None])]
        self._cv = threading.Condition()
        self._next = 0
        self._stop = False
        self._threads = [
            threading.Thread(target=self._work, args=(lane, cpus), daemon=True)
            for lane, cpus in enumerate(lanes)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, request: Request) -> None:
        with self._cv:
            queue = self._queues[self._next % len(self._queues)]
            self._next += 1
            request.enqueued = time.perf_counter()
            queue.order.append(request)
            queue.by_key[request.key].append(request)
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        for thread in self._threads:
            thread.join()

    def _work(self, lane: int, cpus: list[int]) -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        queue = self._queues[lane % len(self._queues)]
        while True:
            with self._cv:
                while queue.head() is None and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                head = queue.head()
                same = queue.by_key[head.key]  # untaken requests of the head's key, oldest first
                window_end = head.enqueued + WINDOW_S
                while not head.taken and not self._stop and len(same) < MAX_BATCH:
                    remaining = window_end - time.perf_counter()
                    if remaining <= 0:
                        break
                    self._cv.wait(remaining)
                if head.taken or self._stop:
                    continue  # another worker sent it
                batch = []
                while same and len(batch) < MAX_BATCH:
                    request = same.popleft()
                    request.taken = True
                    batch.append(request)
            try:
                self._model.run(lane, head.key, len(batch))
                error = None
            except Exception as exc:  # reported per request, like the scheduler does
                error = f"execute_failed: {exc}"
            for request in batch:
                request.error = error
                self._on_done(request)


def run_fixed_window(trace: list[Request], model: LocalityModel, lanes: list[list[int]],
                     round_robin: bool) -> dict:
    pending, finished, start = threading.Condition(), [0], [0.0]

    def on_done(request: Request) -> None:
        request.done = time.perf_counter() - start[0]
        with pending:
            finished[0] += 1
            pending.notify_all()

    batcher = FixedWindowBatcher(model, lanes, round_robin, on_done)
    start[0] = time.perf_counter()
    start[0] = replay(trace, batcher.submit)
    wait_done(trace, pending, finished, 60)
    batcher.close()
    return {}


def percentile(values: list[float], q: float) -> float:
    # "higher" keeps an unserved request (inf) from turning the result into nan.
    return float(np.percentile(values, q, method="higher")) if values else float("nan")


def summarize(trace: list[Request], duration: float, step: Optional[tuple[float, float]]) -> dict:
    out = {"offered": len(trace)}
    good = 0
    for priority in (1, 0):
        mine = [r for r in trace if r.priority == priority]
        lat = [r.done - r.sent for r in mine if r.done is not None and r.error is None]
        ok = sum(1 for r in mine if r.done is not None and r.error is None
                 and r.done - r.sent <= SLO_S[priority])
        good += ok
        out[priority] = {
            "p50": percentile(lat, 50), "p99": percentile(lat, 99), "p999": percentile(lat, 99.9),
            "attain": ok / max(len(mine), 1),
            "rejected": sum(1 for r in mine if r.error is not None) / max(len(mine), 1),
        }
        if step and priority == 1:
            inside = [r for r in mine if step[0] <= r.arrival < step[1]]
            lat_in = [r.done - r.sent for r in inside if r.error is None and r.done is not None]
            out["step_high_p99"] = percentile(lat_in, 99)
            out["step_high_miss"] = sum(
                1 for r in inside
                if r.error is not None or r.done is None or r.done - r.sent > SLO_S[1]
            ) / max(len(inside), 1)
    out["replay_lag_p99"] = percentile([r.sent - r.arrival for r in trace], 99)
    out["goodput"] = good / duration
    out["attain"] = good / max(len(trace), 1)
    return out


def calibrate(compiled: dict[int, bytes], lanes: list[list[int]], seconds: float = 2.0) -> float:
    """Requests/s the scheduler completes when it is never short of work (closed loop, 64 in
    flight, no deadlines, the benchmark's request mix): the capacity loads are scaled to."""
    mix = make_trace(np.random.default_rng(99), lambda t: 1000.0, 60.0, 1.0)
    model = LocalityModel(compiled, len(lanes))
    lock, state = threading.Lock(), {"next": 0, "done": 0, "stop": False}
    scheduler_box: list[AffinityScheduler] = []

    def submit_next() -> None:
        with lock:
            request = mix[state["next"] % len(mix)]
            state["next"] += 1
            request_id = state["next"]
        scheduler_box[0].submit(request_id, request.key, size=request.size)

    def on_complete(request_id: int, error: Optional[str]) -> None:
        with lock:
            state["done"] += error is None
            stop = state["stop"]
        if not stop and error is None:
            submit_next()

    scheduler = AffinityScheduler(lambda key, ids, lane: model.run(lane, key, len(ids)),
                                  on_complete, lanes=lanes, max_batch_size=MAX_BATCH,
                                  max_window_s=0)
    scheduler_box.append(scheduler)
    for _ in range(64):
        submit_next()
    time.sleep(0.5)  # warm the caches before counting
    with lock:
        before = state["done"]
    time.sleep(seconds)
    with lock:
        after = state["done"]
        state["stop"] = True
    scheduler.close(drain=False)
    return (after - before) / seconds


HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per scenario")
    parser.add_argument("--load", type=float, default=0.7, help="offered load / capacity")
    parser.add_argument("--scenarios", default="poisson,poisson-full,gamma,overload")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default="latte,fifo+window,round-robin")
    # The load generator and the workers' Python parts share the GIL; a short hand-over period
    # keeps the generator on time. The same setting applies to every policy.
    parser.add_argument("--switch-interval", type=float, default=0.0005,
                        help="sys.setswitchinterval for the run, seconds (Python's default 0.005)")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where scheduler.json, the page's input, goes (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    torch.set_num_threads(1)  # one intra-op thread per lane: lanes x threads = cores
    torch.set_num_interop_threads(1)
    cores = os.cpu_count() or 1
    lanes = [[0], [1]] if cores >= 2 else [[0]]
    compiled = compile_buckets()
    record = new_results("scheduler", "scheduler", "Scheduler: latte's AffinityScheduler against FIFO with a fixed "
                         "window and round-robin, in process", command_line("benchmarks/scheduler.py", argv),
                         wait_until_quiet(log=print), HERE)
    tables, ratios_by_scenario, step_high = [], {}, None
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores; "
          f"lanes {lanes}; SLO P99 high {SLO_S[1]*1e3:.0f} ms, low {SLO_S[0]*1e3:.0f} ms")
    d = args.duration
    capacity = 0.0  # measured again every round: the machine's spare CPU drifts
    scenarios = {
        "poisson": (lambda t: args.load * capacity, 1.0, None),
        "poisson-full": (lambda t: capacity, 1.0, None),
        "gamma": (lambda t: args.load * capacity, 4.0, None),
        "overload": (lambda t: (2.0 if d / 3 <= t < 2 * d / 3 else 0.6) * capacity, 1.0,
                     (d / 3, 2 * d / 3)),
    }
    policies = {
        "latte": lambda trace, model: run_latte(trace, model, lanes),
        "fifo+window": lambda trace, model: run_fixed_window(trace, model, lanes, False),
        "round-robin": lambda trace, model: run_fixed_window(trace, model, lanes, True),
    }
    for index, name in enumerate(args.scenarios.split(",")):
        rate_at, cv, step = scenarios[name]
        pooled: dict[str, list] = {p: [] for p in policies if p in args.policies.split(",")}
        rounds = []
        for round_ in range(args.rounds):
            # Spare CPU on a shared machine drifts: capacity is measured again every round, and
            # the policy that runs first rotates so none always meets the same phase of it.
            capacity = calibrate(compiled, lanes, seconds=1.0)
            rounds.append((capacity, os.getloadavg()[0]))
            order = [p for p in policies if p in pooled]
            shift = (index + round_) % len(order)
            for policy in order[shift:] + order[:shift]:
                trace = make_trace(np.random.default_rng(args.seed + round_), rate_at, d, cv)
                model = LocalityModel(compiled, len(lanes))
                metrics = policies[policy](trace, model)
                pooled[policy].append((trace, model.warm_rate(), metrics))
        results = {}
        for policy, runs in pooled.items():
            everything = [r for trace, _, _ in runs for r in trace]
            results[policy] = summarize(everything, d * len(runs), step)
            results[policy]["rounds"] = [summarize(t, d, step)["goodput"] for t, _, _ in runs]
            results[policy]["warm"] = float(np.mean([w for _, w, _ in runs]))
            hits = [m["affinity_hit_rate"] for _, _, m in runs if m]
            results[policy]["affinity"] = float(np.mean(hits)) if hits else float("nan")
            if hits:
                latte_metrics = [m for _, _, m in runs]
        print(f"\n### {name} ({'CV 4 Gamma' if cv != 1 else 'Poisson'} arrivals at "
              f"{rate_at(0) / capacity:.1f}x capacity"
              f"{', 2x capacity from %.1f to %.1f s' % step if step else ''}; {args.rounds} "
              f"rounds of {d:.0f} s; capacity per round "
              + ", ".join(f"{c:.0f} req/s (load avg {l:.1f})" for c, l in rounds) + ")")
        print("| policy | goodput req/s | vs fifo | SLO attain | high P50/P99/P99.9 ms "
              "| low P50/P99/P99.9 ms | rejected high/low | warm batches | affinity hits"
              + (" | step, high: P99 ms (served) / missed SLO" if step else "") + " |")
        print("|---" * (9 + bool(step)) + "|")
        base = results.get("fifo+window", next(iter(results.values())))
        cells = []
        for policy, r in results.items():
            ms = lambda p: "/".join(f"{r[p][k]*1e3:.1f}" for k in ("p50", "p99", "p999"))
            row = [policy, f"{r['goodput']:.0f}", f"{r['goodput']/base['goodput']:.2f}x", f"{r['attain']*100:.1f}%",
                   ms(1), ms(0), f"{r[1]['rejected']*100:.1f}%/{r[0]['rejected']*100:.1f}%", f"{r['warm']*100:.0f}%",
                   f"{r['affinity']*100:.0f}%" if r['affinity'] == r['affinity'] else "n/a"]
            if step:
                row.append(f"{r['step_high_p99']*1e3:.1f} / {r['step_high_miss']*100:.1f}%")
                if policy == "latte":
                    step_high = r["step_high_p99"]
            cells.append(row)
            print("| " + " | ".join(row) + " |")
        tables.append(Table(f"{name}: {'Gamma (CV 4)' if cv != 1 else 'Poisson'} arrivals, {args.rounds} rounds of "
                            f"{d:.0f} s; capacity per round " + ", ".join(f"{c:.0f} req/s" for c, _ in rounds) + ":",
                            ["policy", "goodput req/s", "vs fifo", "SLO attainment", "high P50/P99/P99.9 ms",
                             "low P50/P99/P99.9 ms", "rejected high/low", "warm batches", "affinity hits"]
                            + (["step, high: P99 ms / missed SLO"] if step else []), cells))
        if "latte" in results and "fifo+window" in results:
            ratios_by_scenario[name] = results["latte"]["goodput"] / max(results["fifo+window"]["goodput"], 1e-9)
        if "latte" in results and "fifo+window" in results:
            ratios = [a / max(b, 1e-9) for a, b in
                      zip(results["latte"]["rounds"], results["fifo+window"]["rounds"])]
            print("latte / fifo+window goodput per round: "
                  + ", ".join(f"{x:.2f}x" for x in ratios) + f" (median {np.median(ratios):.2f}x)")
        if "latte" in results:
            rejections = collections.Counter()
            for m in latte_metrics:
                rejections.update(m["rejections"])
            print(f"latte: rejections {dict(rejections)}, steals "
                  f"{sum(m['steals'] for m in latte_metrics)}, flushed by timeout "
                  f"{np.mean([m['timeout_flush_share'] for m in latte_metrics])*100:.1f}%")
        print("replay lag P99 (ms): " + ", ".join(
            f"{p} {r['replay_lag_p99']*1e3:.1f}" for p, r in results.items()))
    summary = (f"A TorchScript encoder compiled per shape bucket (Zipf popularity), 25 % of requests continuing "
               f"a session, 20 % high priority (P99 SLO {SLO_S[1]*1e3:.0f} ms), the rest low "
               f"({SLO_S[0]*1e3:.0f} ms); open-loop arrivals replayed identically for each policy, {len(lanes)} "
               f"lanes pinned to cores, {args.rounds} interleaved rounds of {d:.0f} s per scenario, capacity "
               "measured before each round. Goodput: requests completed within their SLO per second.")
    page = dict(summary=summary, tables=tables, targets=[])
    if ratios_by_scenario:
        met = [r >= 1.5 for r in ratios_by_scenario.values()]
        page["targets"].append(Target("≥ 1.5x goodput under SLO against FIFO + a fixed window",
                                      ", ".join(f"{n} {r:.2f}x" for n, r in ratios_by_scenario.items()),
                                      "yes" if all(met) else ("partly" if any(met) else "no"),
                                      why="steady load leaves FIFO's queue short: little to gain but locality"))
    if step_high is not None:
        page["targets"].append(Target(f"high-priority P99 within its {SLO_S[1]*1e3:.0f} ms SLO during the overload step",
                                      f"{step_high*1e3:.1f} ms", "yes" if step_high <= SLO_S[1] else "no"))
    print(f"wrote {write_summary(record, page, args.results_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
