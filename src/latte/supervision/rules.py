"""A model's health rules, read from its config's parameters, and the figures they judge.

Each rule either says nothing or names why the model should be rejuvenated (reloaded before it
breaches): its process's RSS growing faster than allowed, its CPU pegged, its P99 over the SLO,
or its arena fragmented, each held for a window. The execute limit is the hang rule, judged
from the model's flight file instead (a hung instance is killed, not rejuvenated).
"""

from __future__ import annotations

import bisect
import collections
import math
from dataclasses import dataclass
from typing import Deque, Dict, Mapping, Optional, Sequence, Tuple

DEFAULT_EXECUTE_TIMEOUT_S = 60.0
MIN_EXECUTE_TIMEOUT_S = 1.0
DEFAULT_REJUVENATE_INTERVAL_S = 600.0
# P99 judged only over a window with this many requests: a handful says nothing of a tail.
MIN_REQUESTS_FOR_P99 = 50


class RuleError(ValueError):
    """A health rule's parameter that is not a number in range; names the model and parameter."""


def parameters(config: Mapping) -> Dict[str, str]:
    """A Triton config's parameters as plain strings."""
    return {k: str((v or {}).get("string_value", "")) for k, v in (config.get("parameters") or {}).items()}


def _number(model: str, params: Mapping[str, str], key: str, default: Optional[float],
            minimum: float = 0.0) -> Optional[float]:
    raw = params.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise RuleError(f"model '{model}': parameters[\"{key}\"] must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value < minimum:
        raise RuleError(f"model '{model}': parameters[\"{key}\"] must be >= {minimum:g}, got {raw!r}")
    return value


@dataclass(frozen=True)
class HealthRules:
    execute_timeout_s: float = DEFAULT_EXECUTE_TIMEOUT_S
    p99_slo_ms: Optional[float] = None
    p99_window_s: float = 120.0
    rss_growth_mib_per_min: Optional[float] = None
    rss_window_s: float = 300.0
    cpu_pegged_percent: Optional[float] = None
    cpu_pegged_s: float = 120.0
    fragmented_s: Optional[float] = 300.0
    rejuvenate_min_interval_s: float = DEFAULT_REJUVENATE_INTERVAL_S

    @classmethod
    def of(cls, model: str, config: Mapping, execute_timeout_s: float = DEFAULT_EXECUTE_TIMEOUT_S) -> "HealthRules":
        p = parameters(config)
        return cls(
            execute_timeout_s=_number(model, p, "execute_timeout_s", execute_timeout_s, MIN_EXECUTE_TIMEOUT_S),
            p99_slo_ms=_number(model, p, "health_p99_slo_ms", None),
            p99_window_s=_number(model, p, "health_p99_window_s", cls.p99_window_s, 1.0),
            rss_growth_mib_per_min=_number(model, p, "health_rss_growth_mib_per_min", None),
            rss_window_s=_number(model, p, "health_rss_window_s", cls.rss_window_s, 1.0),
            cpu_pegged_percent=_number(model, p, "health_cpu_pegged_percent", None),
            cpu_pegged_s=_number(model, p, "health_cpu_pegged_s", cls.cpu_pegged_s, 1.0),
            fragmented_s=_number(model, p, "health_fragmented_s", cls.fragmented_s, 1.0),
            rejuvenate_min_interval_s=_number(model, p, "rejuvenate_min_interval_s",
                                              DEFAULT_REJUVENATE_INTERVAL_S, 0.0),
        )


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> Optional[float]:
    """The q-quantile of cumulative bucket counts (le=bounds, then +Inf), interpolated within its
    bucket as Prometheus does; None without observations."""
    total = counts[-1] if counts else 0
    if total <= 0:
        return None
    rank = q * total
    i = bisect.bisect_left(list(counts), rank)
    if i >= len(bounds):
        return float(bounds[-1]) if bounds else None
    lower = bounds[i - 1] if i > 0 else 0.0
    below = counts[i - 1] if i > 0 else 0.0
    inside = counts[i] - below
    return lower + (bounds[i] - lower) * ((rank - below) / inside if inside > 0 else 1.0)


Histogram = Tuple[Tuple[float, ...], Tuple[float, ...]]  # bounds, cumulative counts (last +Inf)


class Vitals:
    """One model's figures over time, sampled by the supervisor, and the rules judged on them."""

    def __init__(self, rules: HealthRules) -> None:
        self.rules = rules
        self._rss: Deque[Tuple[float, int]] = collections.deque()
        self._cpu: Deque[Tuple[float, float]] = collections.deque()
        self._latency: Deque[Tuple[float, Histogram]] = collections.deque()
        self._fragmented_since: Optional[float] = None

    def sample_process(self, now: float, rss_bytes: int, cpu_seconds: float) -> None:
        horizon = max(self.rules.rss_window_s, self.rules.cpu_pegged_s) + 5.0
        self._rss.append((now, rss_bytes))
        self._cpu.append((now, cpu_seconds))
        for series in (self._rss, self._cpu):
            while series and now - series[0][0] > horizon:
                series.popleft()

    def sample_metrics(self, now: float, latency: Optional[Histogram], fragmented: Optional[bool]) -> None:
        if latency is not None:
            self._latency.append((now, latency))
            while self._latency and now - self._latency[0][0] > self.rules.p99_window_s + 10.0:
                self._latency.popleft()
        if fragmented is not None:
            if not fragmented:
                self._fragmented_since = None
            elif self._fragmented_since is None:
                self._fragmented_since = now

    def _window(self, series: Deque, window_s: float, now: float):
        """The oldest sample at least `window_s` old and the newest, or None while the series is shorter."""
        old = None
        for sample in series:
            if now - sample[0] >= window_s:
                old = sample
            else:
                break
        return (old, series[-1]) if old is not None and series else None

    def verdict(self, now: float) -> Optional[str]:
        """Why the model should be rejuvenated now (the rule that tripped, with its figures), or None."""
        r = self.rules
        if r.rss_growth_mib_per_min is not None:
            span = self._window(self._rss, r.rss_window_s, now)
            if span:
                (t0, b0), (t1, b1) = span
                rate = (b1 - b0) / (1 << 20) / ((t1 - t0) / 60.0)
                if rate > r.rss_growth_mib_per_min:
                    return (f"RSS grew {rate:.1f} MiB/min over {t1 - t0:.0f} s "
                            f"(rule: at most {r.rss_growth_mib_per_min:g} MiB/min)")
        if r.cpu_pegged_percent is not None:
            span = self._window(self._cpu, r.cpu_pegged_s, now)
            if span:
                samples = [s for s in self._cpu if s[0] >= span[0][0]]
                busy = [100.0 * (b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(samples, samples[1:]) if b[0] > a[0]]
                if busy and min(busy) > r.cpu_pegged_percent:
                    return (f"CPU above {r.cpu_pegged_percent:g} % for {span[1][0] - span[0][0]:.0f} s "
                            f"(lowest {min(busy):.0f} %; rule: {r.cpu_pegged_s:g} s)")
        if r.p99_slo_ms is not None:
            span = self._window(self._latency, r.p99_window_s, now)
            if span:
                (_, (bounds, old)), (_, (_, new)) = span
                delta = [n - o for n, o in zip(new, old)]
                if delta and delta[-1] >= MIN_REQUESTS_FOR_P99:
                    p99_us = histogram_quantile(0.99, bounds, delta)
                    if p99_us is not None and p99_us / 1000.0 > r.p99_slo_ms:
                        return (f"P99 {p99_us / 1000.0:.1f} ms over the SLO {r.p99_slo_ms:g} ms for "
                                f"{r.p99_window_s:g} s ({int(delta[-1])} requests)")
        if r.fragmented_s is not None and self._fragmented_since is not None:
            if now - self._fragmented_since >= r.fragmented_s:
                return f"arena fragmented for {now - self._fragmented_since:.0f} s (rule: {r.fragmented_s:g} s)"
        return None
