"""Latte's Prometheus series, published through Triton's metrics endpoint next to `nv_*`.

Every update of a Triton metric from the Python backend is a round trip to the server
process, so nothing is published on the request path: figures are aggregated here and a
background thread publishes what changed once per `interval_s`. Latency and batch-size
distributions are kept as cumulative bucket counters (`_bucket{le=...}`, `_sum`, `_count`),
which Prometheus' `histogram_quantile` reads like a native histogram, at a publishing cost
that does not grow with the request rate.

`pb` is the stub's triton_python_backend_utils (its MetricFamily), passed in.
"""

from __future__ import annotations

import bisect
import collections
import threading
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from latte.backend.errors import error_class

LATENCY_BUCKETS_US = (100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

Labels = Tuple[Tuple[str, str], ...]
_MAX_DEFERRED = 4096  # records kept unfolded at most (the publisher folds them every second)


class _Histogram:
    def __init__(self, bounds) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.total += value * count

    def observe_all(self, values: np.ndarray, counts: np.ndarray) -> None:
        """counts[i] observations of values[i], for every i: what observe does one at a time."""
        per_bucket = np.bincount(np.searchsorted(self.bounds, values, side="left"), weights=counts,
                                 minlength=len(self.counts))
        for i, count in enumerate(per_bucket.tolist()):
            self.counts[i] += int(count)
        self.total += float(np.dot(values, counts))


class MetricsAggregate:
    """Counters, gauges and histograms kept in-process; `snapshot()` gives publishable values."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: Dict[Tuple[str, Labels], float] = {}
        self.gauges: Dict[Tuple[str, Labels], float] = {}
        self.histograms: Dict[Tuple[str, Labels], _Histogram] = {}
        # Records kept raw on the request path and folded in when read: (fold, record) pairs,
        # fold(record) giving the record's (increments, observations). A deque, because its
        # append and popleft are atomic: a record appended while another thread folds is
        # folded then or at the next read, never lost.
        self._deferred: "collections.deque" = collections.deque()
        # Records of one kind folded together (defer_alike): fold_all -> their deque.
        self._alike: Dict[Callable, "collections.deque"] = {}

    def alike(self, fold_all: Callable) -> "collections.deque":
        """A queue of records to be folded in at the next snapshot together: fold_all(records)
        gives their (increments, observations, bulk observations [(key, bounds, values,
        counts)]). Cheaper than defer per record, for the one kind of record made on nearly
        every execute call; whoever appends calls overflow() past _MAX_DEFERRED."""
        with self._lock:
            return self._alike.setdefault(fold_all, collections.deque())

    def overflow(self, fold_all: Callable) -> None:
        """Fold a queue of alike records now: nobody has read the figures for a while."""
        self._fold_alike(fold_all, self._alike[fold_all])

    def _fold_alike(self, fold_all: Callable, queue: "collections.deque") -> None:
        records = []
        while True:
            try:
                records.append(queue.popleft())
            except IndexError:
                break
        if records:
            increments, observations, bulk = fold_all(records)
            self.update(increments, observations, bulk)

    def defer(self, fold, record) -> None:
        """Keep `record` to be folded in at the next snapshot: the cheapest update there is,
        for one made on every execute call."""
        self._deferred.append((fold, record))
        if len(self._deferred) > _MAX_DEFERRED:  # nobody has read the figures for a while
            self._fold_deferred()

    def _fold_deferred(self) -> None:
        with self._lock:
            alike = list(self._alike.items())
        for fold_all, queue in alike:
            self._fold_alike(fold_all, queue)
        deferred = self._deferred
        while True:
            try:
                fold, record = deferred.popleft()
            except IndexError:
                return
            self.update(*fold(record))

    def add(self, name: str, labels: Mapping[str, str], value: float = 1.0) -> None:
        self.add_all([((name, tuple(sorted(labels.items()))), value)])

    def add_all(self, increments) -> None:
        """Several counter increments under one lock: [((name, sorted label pairs), value)]."""
        self.update(increments, ())

    def set(self, name: str, labels: Mapping[str, str], value: float) -> None:
        with self._lock:
            self.gauges[(name, tuple(sorted(labels.items())))] = float(value)

    def observe(self, name: str, labels: Mapping[str, str], value: float, bounds, count: int = 1) -> None:
        """`count` observations of `value` (requests answered together share their latency)."""
        self.update((), [((name, tuple(sorted(labels.items()))), value, bounds, count)])

    def update(self, increments, observations, bulk=()) -> None:
        """Counter increments [((name, sorted label pairs), value)], histogram observations
        [(key, value, bounds, count)] and arrays of them [(key, bounds, values, counts)] under
        one lock: the backend's updates of one call, or of many folded together."""
        counters, histograms = self.counters, self.histograms
        with self._lock:
            for key, value in increments:
                counters[key] = counters.get(key, 0.0) + value
            for key, value, bounds, count in observations:
                hist = histograms.get(key)
                if hist is None:
                    hist = histograms[key] = _Histogram(bounds)
                hist.observe(value, count)
            for key, bounds, values, counts in bulk:
                hist = histograms.get(key)
                if hist is None:
                    hist = histograms[key] = _Histogram(bounds)
                hist.observe_all(values, counts)

    def snapshot(self) -> Tuple[Dict, Dict]:
        """(cumulative counters, gauges), histograms expanded into _bucket/_sum/_count counters."""
        self._fold_deferred()
        with self._lock:
            counters = dict(self.counters)
            gauges = dict(self.gauges)
            for (name, labels), hist in self.histograms.items():
                running = 0
                for bound, count in zip(list(hist.bounds) + ["+Inf"], hist.counts):
                    running += count
                    le = bound if isinstance(bound, str) else f"{bound:g}"
                    counters[(f"{name}_bucket", labels + (("le", le),))] = float(running)
                counters[(f"{name}_sum", labels)] = hist.total
                counters[(f"{name}_count", labels)] = float(running)
        return counters, gauges


_DESCRIPTIONS = {
    "latte_requests_total": "Requests answered, by outcome (success or the error kind)",
    "latte_request_duration_us": "Time from execute to response per request, by priority level",
    "latte_batch_size": "Rows per model call that served its requests",
    "latte_failed_batches_total": "Model calls that failed (their requests then ran alone, or failed)",
    "latte_model_duration_us_total": "Time spent inside the model runtime",
    "latte_execute_us_total": "Time spent in execute, by stage (read, engine, respond)",
    "latte_execute_calls_total": "execute calls",
    "latte_execute_requests_total": "Requests handed to execute",
    "latte_arena_bytes": "Arena memory by state (capacity, reserved, live, allocated, peak_live)",
    "latte_arena_fragmentation": "Arena fragmentation (internal, external)",
    "latte_arena_page_bytes": "A paged arena's pages, bytes: mapped now (in use or idle) and holding memory (physical_held)",
    "latte_arena_page_calls": "A paged arena's system calls so far: map and unmap",
    "latte_arena_fit_bytes": "Largest request the arena can still serve (largest_free_block) vs the P99 request seen (p99_request)",
    "latte_device_memory_bytes": "A GPU instance's torch memory, bytes: held from the device, live in tensors, their peaks (and the arena's capacity)",
    "latte_device_arena_failures": "Allocations a GPU instance's device arena (device_allocator: arena) refused",
    "latte_resident_memory_bytes": "Resident memory of the process serving this instance (its stub)",
    "latte_arena_fragmented": "1 while the P99 request fits in the free bytes but in no free block: the fragmentation alarm",
    "latte_arena_failures": "Arena allocation failures (all; fragmentation: with live + request <= 80% of capacity)",
    "latte_sessions": "Sessions by state (live, started, ended, expired)",
    "latte_scheduler": "Scheduler figures (affinity_hit_rate, steals, batches, ...)",
    "latte_step_us_total": "Time spent in each step of a fused model's graph",
    "latte_step_rows_total": "Rows each step of a fused model's graph has run",
    "latte_step_calls_total": "Batches each step of a fused model's graph has run",
    "latte_streams": "A streaming model's streams by state (live: stepped each iteration; waiting: to join)",
    "latte_streams_total": "Streams a streaming model ended, by outcome (finished, cancelled, expired, refused, failed)",
    "latte_stream_outputs_total": "Outputs a streaming model sent (one response each when streamed)",
    "latte_stream_iterations_total": "Iterations of a streaming model's loop (one step of every live stream each)",
    "latte_stream_state_bytes": "Stream state held in the pools (held) and what the live streams' rows need at "
                                "block granularity (needed)",
    "latte_stream_cache_blocks": "A streaming model's cache blocks, taken and in the pool (capacity)",
    "latte_stream_first_output_us": "Time from a stream's arrival in execute to its first output sent (time to "
                                    "first token)",
    "latte_stream_inter_output_us": "Time between two outputs of one stream sent (inter-token latency)",
    "latte_thread_budget": "Threads the model's instances compute on (instances x lanes x intra_op_threads), "
                           "by state: within the usable cores or oversubscribed",
}


class TritonPublisher:
    """Publishes a MetricsAggregate through the stub's MetricFamily, from a daemon thread."""

    def __init__(self, pb, aggregate: MetricsAggregate, model: str, interval_s: float = 1.0,
                 refresh=None, instance: str = "") -> None:
        self.pb = pb
        self.refresh = refresh  # called before each publication to update gauges
        self.aggregate = aggregate
        self.model = model
        # Gauges hold one instance's state (arena, sessions); without this label the instances of a
        # model would share one series and each would overwrite the others' value.
        self.gauge_labels = {"instance": instance} if instance else {}
        self.interval_s = interval_s
        self._families: Dict[Tuple[str, str], object] = {}
        self._metrics: Dict[Tuple[str, Labels], object] = {}
        self._published: Dict[Tuple[str, Labels], float] = {}
        self._stop = threading.Event()
        self._flush_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"latte-metrics-{model}", daemon=True)
        self._thread.start()

    def _family(self, name: str, kind: str):
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in _DESCRIPTIONS:
                base = name[: -len(suffix)]
        key = (name, kind)
        family = self._families.get(key)
        if family is None:
            MF = self.pb.MetricFamily
            family = self._families[key] = MF(name, _DESCRIPTIONS.get(base, name), getattr(MF, kind))
        return family

    def _metric(self, name: str, labels: Labels, kind: str):
        key = (name, labels)
        metric = self._metrics.get(key)
        if metric is None:
            own = self.gauge_labels if kind == "GAUGE" else {}
            metric = self._metrics[key] = self._family(name, kind).Metric(labels={"model": self.model, **own,
                                                                                   **dict(labels)})
        return metric

    def flush(self) -> None:
        with self._flush_lock:
            if self.refresh is not None:
                self.refresh()
            counters, gauges = self.aggregate.snapshot()
            for key, value in counters.items():
                delta = value - self._published.get(key, 0.0)
                if delta > 0:
                    self._metric(key[0], key[1], "COUNTER").increment(delta)
                    self._published[key] = value
            for key, value in gauges.items():
                if self._published.get(key) != value:
                    self._metric(key[0], key[1], "GAUGE").set(value)
                    self._published[key] = value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception as exc:  # never let a metrics hiccup take the model down
                self.pb.Logger.log_warn(f"latte: publishing metrics failed: {exc}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


_STEP_SERIES = ("latte_step_us_total", "latte_step_rows_total", "latte_step_calls_total")
_EXECUTE_CALLS = ("latte_execute_calls_total", ())
_EXECUTE_REQUESTS = ("latte_execute_requests_total", ())
_STAGE_READ = ("latte_execute_us_total", (("stage", "read"),))
_STAGE_ENGINE = ("latte_execute_us_total", (("stage", "engine"),))
_STAGE_RESPOND = ("latte_execute_us_total", (("stage", "respond"),))
_MODEL_US = ("latte_model_duration_us_total", ())
_BATCH_SIZE = ("latte_batch_size", ())
_FAILED_BATCHES = ("latte_failed_batches_total", ())


def _stages(requests: int, read_s: float, engine_s: float, respond_s: float) -> list:
    return [(_EXECUTE_CALLS, 1.0), (_EXECUTE_REQUESTS, requests), (_STAGE_READ, read_s * 1e6),
            (_STAGE_ENGINE, engine_s * 1e6), (_STAGE_RESPOND, respond_s * 1e6)]


def _batch(rows: int, seconds: float, failed: bool, increments: list, observations: list) -> None:
    """One model call: its time inside the runtime, and its rows where it served them (a
    failed batch's requests are answered by their retries alone or as failures)."""
    increments.append((_MODEL_US, seconds * 1e6))
    if failed:
        increments.append((_FAILED_BATCHES, 1.0))
    else:
        observations.append((_BATCH_SIZE, rows, BATCH_BUCKETS, 1))


class BackendMetrics:
    """The figures the backend records; cheap in-process updates only (a few per execute
    call, whatever its number of requests)."""

    def __init__(self, aggregate: Optional[MetricsAggregate] = None) -> None:
        self.aggregate = aggregate or MetricsAggregate()
        self._outcome_keys: Dict[str, Tuple[str, Labels]] = {}
        self._priority_keys: Dict[int, Tuple[str, Labels]] = {}
        self._plain_calls = self.aggregate.alike(_fold_plain_calls)
        self._stream_outputs = self.aggregate.alike(_fold_stream_outputs)
        self._totals_seen: Dict[Tuple[str, Labels], float] = {}  # running totals last read, by counter

    def requests(self, counts: Mapping[Tuple[str, int], int], seconds: float) -> None:
        """Requests answered together: (outcome, priority) -> how many."""
        increments, observations = [], []
        self._answered(counts, seconds, increments, observations)
        self.aggregate.update(increments, observations)

    def execute(self, requests: int, read_s: float, engine_s: float, respond_s: float) -> None:
        """Where one execute call's time went: reading requests, the engine (planning,
        packing, model calls, splitting), building and sending responses."""
        self.aggregate.add_all(_stages(requests, read_s, engine_s, respond_s))

    def batch(self, rows: int, seconds: float, failed: bool = False) -> None:
        increments, observations = [], []
        _batch(rows, seconds, failed, increments, observations)
        self.aggregate.update(increments, observations)

    def call(self, requests: int, read_s: float, engine_s: float, respond_s: float,
             answered: Sequence[Tuple[Mapping[Tuple[str, int], int], float]],
             batches: Sequence[Tuple[int, float, bool]]) -> None:
        """A whole execute call: its stages (as `execute`), each group of answered requests
        with its latency (as `requests`) and each batch (as `batch`); kept as it is and
        folded in when the figures are read."""
        self.aggregate.defer(self._fold_call, (requests, read_s, engine_s, respond_s, answered, batches))

    def plain_call(self, requests: int, read_s: float, engine_s: float, respond_s: float, rows: int,
                   model_s: float) -> None:
        """The common execute call: every request answered with outputs at default priority,
        from one model call of `rows` rows; the same figures as `call`, folded many at a time."""
        queue = self._plain_calls
        queue.append((requests, read_s, engine_s, respond_s, read_s + engine_s, rows, model_s))
        if len(queue) > _MAX_DEFERRED:
            self.aggregate.overflow(_fold_plain_calls)

    def _fold_call(self, record) -> Tuple[list, list]:
        requests, read_s, engine_s, respond_s, answered, batches = record
        increments = _stages(requests, read_s, engine_s, respond_s)
        observations = []
        for counts, seconds in answered:
            self._answered(counts, seconds, increments, observations)
        for rows, seconds, failed in batches:
            _batch(rows, seconds, failed, increments, observations)
        return increments, observations

    def _answered(self, counts, seconds: float, increments: list, observations: list) -> None:
        us = seconds * 1e6
        for (outcome, priority), count in counts.items():
            key = self._outcome_keys.get(outcome)
            if key is None:
                key = self._outcome_keys[outcome] = ("latte_requests_total", (("outcome", outcome),))
            increments.append((key, count))
            key = self._priority_keys.get(priority)
            if key is None:
                key = self._priority_keys[priority] = ("latte_request_duration_us", (("priority", str(priority)),))
            observations.append((key, us, LATENCY_BUCKETS_US, count))

    def arena(self, stats: Mapping[str, float]) -> None:
        for state in ("capacity", "reserved", "live", "allocated", "peak_live"):
            if state in stats:
                self.aggregate.set("latte_arena_bytes", {"state": state}, stats[state])
        for kind in ("internal", "external"):
            if f"{kind}_fragmentation" in stats:
                self.aggregate.set("latte_arena_fragmentation", {"kind": kind}, stats[f"{kind}_fragmentation"])
        # What can alarm: 1 - largest/free above reads ~0.5 for any buddy arena with a block live.
        for figure in ("largest_free_block", "p99_request"):
            if figure in stats:
                self.aggregate.set("latte_arena_fit_bytes", {"figure": figure}, stats[figure])
        if "fragmented" in stats:
            self.aggregate.set("latte_arena_fragmented", {}, float(stats["fragmented"]))
        if stats.get("paged"):  # pages: the memory a paged arena holds, and the calls it made for it
            for state in ("mapped", "physical_held"):
                self.aggregate.set("latte_arena_page_bytes", {"state": state}, stats[state])
            for call in ("map", "unmap"):
                self.aggregate.set("latte_arena_page_calls", {"call": call}, stats[f"{call}_calls"])
        for kind, key in (("all", "failures"), ("fragmentation", "fragmentation_failures")):
            if key in stats:
                self.aggregate.set("latte_arena_failures", {"kind": kind}, stats[key])

    def resident_memory(self, value: float) -> None:
        self.aggregate.set("latte_resident_memory_bytes", {}, value)

    def device_memory(self, figures: Mapping[str, float], arena_failures: Optional[float] = None) -> None:
        """A GPU instance's torch memory by state, and what its device arena refused
        (backend/device_memory.py)."""
        for state, value in figures.items():
            self.aggregate.set("latte_device_memory_bytes", {"state": state}, value)
        if arena_failures is not None:
            self.aggregate.set("latte_device_arena_failures", {}, arena_failures)

    def streams(self, figures: Mapping[str, float]) -> None:
        """A streaming model's figures (StreamingModel.figures): gauges as they are, running
        totals counted as what was added since the last reading."""
        gauge = self.aggregate.set
        gauge("latte_streams", {"state": "live"}, figures["live"])
        gauge("latte_streams", {"state": "waiting"}, figures["waiting"])
        gauge("latte_stream_state_bytes", {"state": "held"}, figures["held_bytes"])
        gauge("latte_stream_state_bytes", {"state": "needed"}, figures["needed_bytes"])
        if "cache_capacity" in figures:
            gauge("latte_stream_cache_blocks", {"state": "taken"}, figures["cache_blocks"])
            gauge("latte_stream_cache_blocks", {"state": "capacity"}, figures["cache_capacity"])
        self._running_totals([(("latte_streams_total", (("outcome", outcome),)), figures[outcome])
                              for outcome in ("finished", "cancelled", "expired", "refused", "failed")]
                             + [(("latte_stream_outputs_total", ()), figures["outputs"]),
                                (("latte_stream_iterations_total", ()), figures["iterations"])])

    def stream_output(self, first: bool, seconds: float) -> None:
        """One output of a stream sent: `seconds` since the stream arrived (its first) or since
        its previous output; a sender thread's append, folded when the figures are read."""
        queue = self._stream_outputs
        queue.append((first, seconds))
        if len(queue) > _MAX_DEFERRED:  # nobody has read the figures for a while
            self.aggregate.overflow(_fold_stream_outputs)

    def sessions(self, live: int, started: int, ended: int, expired: int) -> None:
        for state, value in (("live", live), ("started", started), ("ended", ended), ("expired", expired)):
            self.aggregate.set("latte_sessions", {"state": state}, value)

    def steps(self, figures: Mapping[str, Mapping[str, float]]) -> None:
        """A graph's steps, from the runtime's running totals: time inside each, and the rows
        and batches it has run (counted as what was added since the last reading)."""
        self._running_totals([((name, (("step", step),)), value) for step, f in figures.items()
                              for name, value in zip(_STEP_SERIES, (f["seconds"] * 1e6, f["rows"], f["calls"]))])

    def _running_totals(self, totals) -> None:
        """Counters from running totals [((name, label pairs), total)]: each increased by what its
        total added since the last reading."""
        increments = []
        for key, total in totals:
            before = self._totals_seen.get(key, 0.0)
            if total > before:
                increments.append((key, total - before))
                self._totals_seen[key] = total
        if increments:
            self.aggregate.add_all(increments)

    def thread_budget(self, state: str, threads: int) -> None:
        self.aggregate.set("latte_thread_budget", {"state": state}, threads)

    def scheduler(self, figures: Mapping[str, float]) -> None:
        for name, value in figures.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.aggregate.set("latte_scheduler", {"figure": name}, value)


_SUCCESSES = ("latte_requests_total", (("outcome", "success"),))
_DEFAULT_PRIORITY_LATENCY = ("latte_request_duration_us", (("priority", "0"),))


def _fold_plain_calls(records: List[tuple]) -> Tuple[list, list, list]:
    """What BackendMetrics.call would record for each of these plain calls, added up."""
    requests, read_s, engine_s, respond_s, latency_s, rows, model_s = np.array(records, dtype=np.float64).T
    answered = float(requests.sum())
    increments = [(_EXECUTE_CALLS, float(len(records))), (_EXECUTE_REQUESTS, answered),
                  (_STAGE_READ, float(read_s.sum()) * 1e6), (_STAGE_ENGINE, float(engine_s.sum()) * 1e6),
                  (_STAGE_RESPOND, float(respond_s.sum()) * 1e6), (_SUCCESSES, answered),
                  (_MODEL_US, float(model_s.sum()) * 1e6)]
    bulk = [(_DEFAULT_PRIORITY_LATENCY, LATENCY_BUCKETS_US, latency_s * 1e6, requests),
            (_BATCH_SIZE, BATCH_BUCKETS, rows, np.ones_like(rows))]
    return increments, [], bulk


_FIRST_OUTPUT = ("latte_stream_first_output_us", ())
_INTER_OUTPUT = ("latte_stream_inter_output_us", ())


def _fold_stream_outputs(records: List[tuple]) -> Tuple[list, list, list]:
    """(first, seconds) of each output a streaming model sent: the time to its stream's first
    output, or since its previous one."""
    first, seconds = np.array(records, dtype=np.float64).T
    bulk = []
    for key, chosen in ((_FIRST_OUTPUT, first > 0), (_INTER_OUTPUT, first == 0)):
        values = seconds[chosen] * 1e6
        if len(values):
            bulk.append((key, LATENCY_BUCKETS_US, values, np.ones_like(values)))
    return [], [], bulk


def outcome_label(exc: Optional[BaseException]) -> str:
    """The `outcome` of latte_requests_total for a request answered with `exc` (None: success)."""
    if exc is None:
        return "success"
    return error_class(exc).label
