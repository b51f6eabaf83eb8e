"""What `latte watch URL` shows of a running server, one scrape of its metrics at a time:
per model, throughput, P50/P95/P99 between two scrapes (latte_request_duration_us), the queue,
the arena, resident memory, errors, and the P95 forecast over the watch so far (forecast.py).
Free of the terminal: `latte watch` draws what `Watcher.rows()` gives.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from latte.bench.forecast import MIN_SAMPLES, fit_latency
from latte.bench.prometheus_scrape import split_key

DURATION = "latte_request_duration_us_bucket"
COLUMNS = ("model", "req/s", "P50 ms", "P95 ms", "P99 ms", "queue", "arena live / held MiB", "fragmented",
           "RSS MiB", "errors/s", "forecast")


def quantile(q: float, buckets: List[Tuple[float, float]]) -> float:
    """histogram_quantile over (upper bound, cumulative count) pairs, as Prometheus computes it."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return buckets[-1][0]


def _by_model(values: Dict[str, float], name: str, **match: str) -> Dict[str, float]:
    found: Dict[str, float] = {}
    for key, value in values.items():
        series, labels = split_key(key)
        if series == name and "model" in labels and all(labels.get(k) == v for k, v in match.items()):
            found[labels["model"]] = found.get(labels["model"], 0.0) + value
    return found


def _buckets(values: Dict[str, float]) -> Dict[str, Dict[float, float]]:
    found: Dict[str, Dict[float, float]] = {}
    for key, value in values.items():
        series, labels = split_key(key)
        if series == DURATION and "model" in labels:
            le = float("inf") if labels.get("le") == "+Inf" else float(labels["le"])
            per = found.setdefault(labels["model"], {})
            per[le] = per.get(le, 0.0) + value
    return found


@dataclass
class Watcher:
    slo_ms: float = 100.0
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)
    previous: Optional[Tuple[float, Dict[str, float]]] = None
    history: Dict[str, List[Tuple[float, float]]] = field(default_factory=dict)   # model -> (s, P95 ms)
    latest: List[Dict[str, str]] = field(default_factory=list)

    def add(self, values: Dict[str, float]) -> List[Dict[str, str]]:
        """Take one scrape; the table's rows (empty after the first: figures are between scrapes)."""
        now = self.clock()
        if self.previous is None:
            self.started, self.previous = now, (now, values)
            return []
        before_t, before = self.previous
        seconds = max(1e-9, now - before_t)
        self.previous = (now, values)
        self.latest = self._rows(before, values, seconds, now - self.started)
        return self.latest

    def _rows(self, before: Dict[str, float], after: Dict[str, float], seconds: float, uptime: float):
        requests = _by_model(after, "latte_requests_total")
        requests_before = _by_model(before, "latte_requests_total")
        successes = _by_model(after, "latte_requests_total", outcome="success")
        successes_before = _by_model(before, "latte_requests_total", outcome="success")
        buckets, buckets_before = _buckets(after), _buckets(before)
        pending = _by_model(after, "nv_inference_pending_request_count")
        live = _by_model(after, "latte_arena_bytes", state="live")
        held = _by_model(after, "latte_arena_bytes", state="allocated")
        fragmented = _by_model(after, "latte_arena_fragmented")
        resident = _by_model(after, "latte_resident_memory_bytes")
        rows = []
        for model in sorted(requests):
            rate = (requests[model] - requests_before.get(model, 0.0)) / seconds
            failed = rate - (successes.get(model, 0.0) - successes_before.get(model, 0.0)) / seconds
            delta = [(le, count - buckets_before.get(model, {}).get(le, 0.0))
                     for le, count in buckets.get(model, {}).items()]
            p50, p95, p99 = (quantile(q, delta) / 1000 for q in (0.50, 0.95, 0.99))
            if not math.isnan(p95):
                self.history.setdefault(model, []).append((uptime, p95))
            rows.append({"model": model, "req/s": f"{rate:,.1f}", "P50 ms": _ms(p50), "P95 ms": _ms(p95),
                         "P99 ms": _ms(p99), "queue": f"{pending.get(model, 0):.0f}",
                         "arena live / held MiB": f"{live.get(model, 0) / 2 ** 20:,.1f} / {held.get(model, 0) / 2 ** 20:,.1f}",
                         "fragmented": "ALARM" if fragmented.get(model, 0) >= 1 else "no",
                         "RSS MiB": f"{resident.get(model, 0) / 2 ** 20:,.0f}", "errors/s": f"{max(failed, 0):,.2f}",
                         "forecast": self.forecast_text(model)})
        return rows

    def forecast_text(self, model: str) -> str:
        samples = self.history.get(model, [])
        if len(samples) < MIN_SAMPLES:
            return f"({len(samples)}/{MIN_SAMPLES} samples)"
        return fit_latency([t for t, _ in samples], [p for _, p in samples], self.slo_ms).text()


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"
