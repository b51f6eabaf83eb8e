"""Latte's Prometheus series, published through Triton's metrics endpoint next to `nv_*`.

`pb` is the stub's triton_python_backend_utils (its MetricFamily), passed in.
"""

from __future__ import annotations

import threading
from typing import Dict, Mapping, Optional, Tuple

_LATENCY_BUCKETS_US = [100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000]
_BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


class BackendMetrics:
    def __init__(self, pb, model: str, max_batch_size: int) -> None:
        MF = pb.MetricFamily
        self._model = model
        self._lock = threading.Lock()
        self._metrics: Dict[Tuple[str, Tuple], object] = {}
        self._families = {
            "requests": MF("latte_requests_total", "Requests answered, by outcome (success or the error kind)", MF.COUNTER),
            "latency": MF("latte_request_duration_us", "Time from execute to response per request, by priority", MF.HISTOGRAM),
            "batch": MF("latte_batch_size", "Rows per model call", MF.HISTOGRAM),
            "padding": MF("latte_padding_ratio", "Share of padded positions in the last batch of ragged inputs", MF.GAUGE),
            "model_time": MF("latte_model_duration_us_total", "Time spent inside the model runtime", MF.COUNTER),
            "arena": MF("latte_arena_bytes", "Arena memory by state (capacity, reserved, live, allocated, peak_live)", MF.GAUGE),
            "fragmentation": MF("latte_arena_fragmentation", "Arena fragmentation (internal, external)", MF.GAUGE),
            "sessions": MF("latte_sessions", "Sessions by state (live, started, ended, expired)", MF.GAUGE),
            "scheduler": MF("latte_scheduler", "Scheduler figures (affinity_hit_rate, steals, queue depth...)", MF.GAUGE),
        }
        self._batch_limit = max_batch_size

    def _metric(self, family: str, labels: Mapping[str, str], buckets=None):
        key = (family, tuple(sorted(labels.items())))
        with self._lock:
            metric = self._metrics.get(key)
            if metric is None:
                full = {"model": self._model, **labels}
                if buckets is None:
                    metric = self._families[family].Metric(labels=full)
                else:
                    metric = self._families[family].Metric(labels=full, buckets=buckets)
                self._metrics[key] = metric
            return metric

    def request(self, outcome: str, priority: int, seconds: float) -> None:
        self._metric("requests", {"outcome": outcome}).increment(1)
        self._metric("latency", {"priority": str(priority)}, _LATENCY_BUCKETS_US).observe(seconds * 1e6)

    def batch(self, rows: int, seconds: float, padded_length: Optional[int], used_positions: Optional[int]) -> None:
        self._metric("batch", {}, _BATCH_BUCKETS).observe(rows)
        self._metric("model_time", {}).increment(seconds * 1e6)
        if padded_length and used_positions is not None:
            self._metric("padding", {}).set(1.0 - used_positions / float(rows * padded_length))

    def arena(self, stats: Mapping[str, float]) -> None:
        for state in ("capacity", "reserved", "live", "allocated", "peak_live"):
            if state in stats:
                self._metric("arena", {"state": state}).set(float(stats[state]))
        for kind in ("internal", "external"):
            key = f"{kind}_fragmentation"
            if key in stats:
                self._metric("fragmentation", {"kind": kind}).set(float(stats[key]))

    def sessions(self, live: int, started: int, ended: int, expired: int) -> None:
        for state, value in (("live", live), ("started", started), ("ended", ended), ("expired", expired)):
            self._metric("sessions", {"state": state}).set(float(value))

    def scheduler(self, figures: Mapping[str, float]) -> None:
        for name, value in figures.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._metric("scheduler", {"figure": name}).set(float(value))


def outcome_label(exc: Optional[BaseException]) -> str:
    if exc is None:
        return "success"
    name = type(exc).__name__
    return {"RequestError": "bad_request", "DeadlineExceeded": "timeout", "MemoryError": "out_of_memory",
            "ModelError": "model_error", "RequestCancelled": "cancelled"}.get(name, "error")
