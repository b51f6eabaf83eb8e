"""Soak: a steady variable-shape load for N requests or a duration, sampled window by window."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np

from latte.bench.arena import arena_figures
from latte.bench.inputs import fetch_model_inputs
from latte.bench.lengths import LengthDistribution
from latte.bench.loadgen import AsyncSender, Outcomes, percentile
from latte.bench.prometheus_scrape import MetricsSampler
from latte.bench.target import Target

# The arena's fragmentation alarm (docs/memory.md), a bound of zero in every soak: no window may
# find the P99 request too large for every free block while the free bytes would hold it, and no
# allocation may fail with live + request <= 80 % of the capacity. (1 - largest free / free is
# reported but not bounded: a buddy arena reads ~50 % with one block live, healthy or not.)
ARENA_TARGETS = {"fragmented_windows": 0, "fragmentation_failures": 0}
# Targets after 1M requests (the on-demand long soak).
LONG_TARGETS = {"rss_growth": 0.02, "p99_drift": 0.05, **ARENA_TARGETS}
# The short CI soak (20k requests on a shared 2-core machine): memory bounds stay tight because
# RSS is not disturbed by neighbours; latency bounds are loose because P99 over a few thousand
# requests is, and P50 and the median-of-thirds P99 stand in for the single-window figure.
SHORT_TARGETS = {"rss_growth": 0.05, "p50_drift": 1.0, "p99_drift_thirds": 3.0, **ARENA_TARGETS}
# Ratios are bounded as a share, the arena's figures as counts. With a control served beside the
# model, its latency drifts are read against the control's (the `_vs_control` figures).
_RATIO_CHECKS = [("server_rss_growth", "rss_growth"), ("stubs_rss_growth", "rss_growth"), ("p99_drift", "p99_drift"),
                 ("p99_drift_thirds", "p99_drift_thirds"), ("p50_drift", "p50_drift")]
_AGAINST_CONTROL = ("p99_drift", "p99_drift_thirds", "p50_drift")
_COUNT_CHECKS = ["fragmented_windows", "fragmentation_failures"]


@dataclass
class SoakSettings:
    model: str
    requests: Optional[int] = None        # stop after this many requests ...
    duration_s: Optional[float] = None    # ... or after this many seconds
    windows: int = 10
    in_flight: int = 4
    warmup_requests: int = 500
    lengths: LengthDistribution = field(default_factory=lambda: LengthDistribution.parse("lognormal"))
    distinct_requests: int = 256
    seed: int = 0
    slo_ms: float = 100.0                 # the P95 bound the forecast projects to
    # The requests to cycle through, when the model's config cannot say how to make them up
    # (a fused pipeline taking text or image bytes); None: made up from its config.
    feeds: Optional[List[Dict[str, np.ndarray]]] = None
    # A second model served beside it, sent the same requests in alternating slices of each
    # window: the host's own swing shows in both, so the model's drift is read against it.
    control: Optional[str] = None
    slices: int = 10                      # per window, each model's share sent in this many turns

    def validate(self) -> None:
        if (self.requests is None) == (self.duration_s is None):
            raise ValueError("a soak runs for a number of requests or for a duration: give exactly one")
        if self.requests is not None and self.requests < self.windows:
            raise ValueError(f"a soak of {self.requests} requests cannot fill {self.windows} windows")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"the soak duration must be > 0 s, got {self.duration_s}")
        if self.windows < 2:
            raise ValueError(f"a soak needs at least 2 windows to compare, got {self.windows}")
        if self.control is not None and self.control == self.model:
            raise ValueError(f"the control must be another model than the one soaked ({self.model})")
        if self.slices < 1:
            raise ValueError(f"a window is sent in at least one slice, got {self.slices}")


def parse_soak_amount(text: str) -> dict:
    """'20000', '20k', '1M' -> a request count; '90s', '10m' or '10min', '2h' -> a duration (seconds)."""
    raw = text.strip()
    counts = {"k": 1_000, "K": 1_000, "M": 1_000_000}
    seconds = {"min": 60, "s": 1, "m": 60, "h": 3600}
    try:
        for suffix, factor in seconds.items():
            if raw.endswith(suffix):
                value = float(raw[:-len(suffix)])
                if value <= 0:
                    raise ValueError
                return {"duration_s": value * factor}
        if raw and raw[-1] in counts:
            value = int(float(raw[:-1]) * counts[raw[-1]])
        else:
            value = int(raw)
        if value <= 0:
            raise ValueError
        return {"requests": value}
    except ValueError:
        raise ValueError(f"--soak takes a request count (20000, 20k, 1M) or a duration (90s, 10min, 2h); "
                         f"got {text!r}") from None


def model_stubs(rss: dict, model: str) -> dict:
    """RSS of the stubs serving `model` (their instances are named <model>_<group>_<index>)."""
    return {k: v for k, v in rss.items() if k.startswith("stub:") and k.split(":")[-1].startswith(model + "_")}


def _thirds(windows: List[dict], key: str):
    """Median of `key` over the first third of the windows and over the last third.

    On a shared machine one window's P99 can be a neighbour's burst; the median of several
    windows shows drift without betting on a single one.
    """
    n = max(1, len(windows) // 3)
    return float(np.median([w[key] for w in windows[:n]])), float(np.median([w[key] for w in windows[-n:]]))


def _growth(first: Optional[float], last: Optional[float]) -> Optional[float]:
    if first is None or last is None or first == 0:
        return None
    return last / first - 1.0


def _relative(ours: Optional[float], control: Optional[float]) -> Optional[float]:
    """Growth of ours as a multiple of the control's growth, as a growth: 1.10 / 1.05 - 1."""
    if ours is None or control is None or control <= -1.0:
        return None
    return (1.0 + ours) / (1.0 + control) - 1.0


def _alarmed_windows(windows: List[dict]) -> Optional[int]:
    """Windows that ended with the arena's fragmentation alarm raised; None when not exported."""
    flags = [w["arena_fragmented"] for w in windows if w.get("arena_fragmented") is not None]
    return sum(1 for f in flags if f >= 1) if flags else None


def run_soak(target: Target, settings: SoakSettings, progress: Optional[Callable[[float, str], None]] = None) -> dict:
    """Run the soak; returns per-window samples and first -> last growth ratios."""
    settings.validate()
    if not target.grpc_url:
        raise ValueError("the soak sends gRPC requests: give --grpc-url with --url")
    rng = np.random.default_rng(settings.seed)
    if settings.feeds is not None:
        feeds = settings.feeds
    else:
        model_inputs = fetch_model_inputs(target.http_url, settings.model)
        feeds = model_inputs.requests(rng, settings.distinct_requests, settings.lengths)
    sender = AsyncSender(target.grpc_url, settings.model, settings.in_flight)
    outcomes = Outcomes()
    control = None if settings.control is None else AsyncSender(target.grpc_url, settings.control, settings.in_flight)
    control_outcomes = Outcomes()

    def send_slices(count: int, offset: int) -> None:
        """`count` requests to the model and as many to the control, in alternating slices."""
        if control is None:
            for i in range(count):
                sender.send(feeds[(offset + i) % len(feeds)], outcomes)
            return
        edges = np.linspace(0, count, settings.slices + 1).astype(int)
        for a, b in zip(edges[:-1], edges[1:]):
            for to, into in ((sender, outcomes), (control, control_outcomes)):
                for i in range(a, b):
                    to.send(feeds[(offset + i) % len(feeds)], into)
                to.drain(120)

    sampler = MetricsSampler(target.metrics_url, target.server_pid, interval=3600)  # sampled per window only
    windows: List[dict] = []
    try:
        send_slices(settings.warmup_requests, 0)
        sender.drain(120)
        outcomes.take_latencies()
        control_outcomes.take_latencies()
        per_window = settings.requests // settings.windows if settings.requests else None
        window_s = settings.duration_s / settings.windows if settings.duration_s else None
        sent = 0
        started = time.perf_counter()
        for w in range(settings.windows):
            window_start = time.perf_counter()
            answered_before = outcomes.succeeded
            failed_before = outcomes.failed
            control_failed_before = control_outcomes.failed
            if per_window is not None:
                send_slices(per_window, sent)
                sent += per_window
            else:
                # With a control, each turn is long enough to keep in_flight requests going.
                turn = settings.slices * settings.in_flight * 8 if control else 1
                while time.perf_counter() - window_start < window_s:
                    send_slices(turn, sent)
                    sent += turn
            sender.drain(120)
            elapsed = time.perf_counter() - window_start
            latencies = outcomes.take_latencies()
            if control is not None:
                # Both shared the window: each one's rate is its requests over the whole of it.
                theirs = control_outcomes.take_latencies()
                control_row = {"control_p50_ms": round(percentile(theirs, 50), 3),
                               "control_p99_ms": round(percentile(theirs, 99), 3),
                               "control_throughput": round(len(theirs) / elapsed, 1) if elapsed > 0 else 0.0,
                               "control_errors": control_outcomes.failed - control_failed_before}
            else:
                control_row = {}
            sample = sampler.sample_now()
            row = {
                "window": w + 1, "t": round(time.perf_counter() - started, 2),
                "requests": outcomes.succeeded - answered_before + outcomes.failed - failed_before,
                "errors": outcomes.failed - failed_before,
                "throughput": round(len(latencies) / elapsed, 1) if elapsed > 0 else 0.0,
                "p50_ms": round(percentile(latencies, 50), 3), "p95_ms": round(percentile(latencies, 95), 3),
                "p99_ms": round(percentile(latencies, 99), 3),
                "server_rss_mb": round(sample.server_rss / 2**20, 2),
                "stubs_rss_mb": round(sum(model_stubs(sample.rss, settings.model).values()) / 2**20, 2),
                "stub_rss_mb": {k: round(v / 2**20, 2) for k, v in sample.rss.items() if k.startswith("stub:")},
                **arena_figures(sample.metrics, settings.model),
                **control_row,
            }
            windows.append(row)
            if progress:
                progress((w + 1) / settings.windows, f"window {w + 1}/{settings.windows}: {row['throughput']:.0f} req/s, "
                         f"P99 {row['p99_ms']:.2f} ms, server {row['server_rss_mb']:.0f} MiB, "
                         f"stubs {row['stubs_rss_mb']:.0f} MiB")
    finally:
        for each in (sender, control):
            if each is not None:
                each.drain(60)
                each.close()
    first, last = windows[0], windows[-1]
    ratios = {
        "server_rss_growth": _growth(first["server_rss_mb"], last["server_rss_mb"]),
        "stubs_rss_growth": _growth(first["stubs_rss_mb"], last["stubs_rss_mb"]),
        "p99_drift": _growth(first["p99_ms"], last["p99_ms"]),
        "p99_drift_thirds": _growth(*_thirds(windows, "p99_ms")),
        "p50_drift": _growth(first["p50_ms"], last["p50_ms"]),
        "throughput_change": _growth(first["throughput"], last["throughput"]),
        "fragmentation_first": first["fragmentation"],
        "fragmentation_last": last["fragmentation"],
        "fragmented_windows": _alarmed_windows(windows),
        "fragmentation_failures": last["arena_fragmentation_failures"],
        "largest_free_last": last["arena_largest_free_bytes"],
        "p99_request_last": last["arena_p99_request_bytes"],
        "arena_reserved_growth": _growth(first["arena_reserved_bytes"], last["arena_reserved_bytes"]),
    }
    if control is not None:
        ratios["control_p99_drift"] = _growth(first["control_p99_ms"], last["control_p99_ms"])
        ratios["control_p99_drift_thirds"] = _growth(*_thirds(windows, "control_p99_ms"))
        ratios["control_p50_drift"] = _growth(first["control_p50_ms"], last["control_p50_ms"])
        for key in _AGAINST_CONTROL:
            ratios[f"{key}_vs_control"] = _relative(ratios[key], ratios[f"control_{key}"])
    return {"model": settings.model, "requests": outcomes.sent, "warmup_requests": settings.warmup_requests,
            "answered": outcomes.answered, "succeeded": outcomes.succeeded, "failed": outcomes.failed,
            "errors": dict(outcomes.errors), "in_flight": settings.in_flight, "control": settings.control,
            "control_failed": control_outcomes.failed if control is not None else None,
            "control_unanswered": control_outcomes.sent - control_outcomes.answered if control is not None else None,
            "lengths": settings.lengths.describe(), "windows": windows, "ratios": ratios,
            "forecast": soak_forecast(windows, settings.slo_ms)}


def soak_forecast(windows: List[dict], slo_ms: float) -> Optional[dict]:
    """P95 against uptime fitted and projected to the SLO (forecast.py); None with too few windows."""
    from latte.bench.forecast import MIN_SAMPLES, fit_latency

    if len(windows) < MIN_SAMPLES:
        return None
    return fit_latency([w["t"] for w in windows], [w["p95_ms"] for w in windows], slo_ms).as_dict()


def check_ratios(ratios: dict, bounds: dict) -> List[str]:
    """Messages for each figure over its bound (empty when all hold); absent figures are skipped."""
    failures = []
    for key, bound_key in _RATIO_CHECKS:
        if key in _AGAINST_CONTROL and ratios.get(f"{key}_vs_control") is not None:
            key = f"{key}_vs_control"   # the host's swing, which the control shares, taken out
        value = ratios.get(key)
        if value is not None and bound_key in bounds and value > bounds[bound_key]:
            failures.append(f"{key} = {value:+.1%} exceeds the bound {bounds[bound_key]:.0%}")
    for key in _COUNT_CHECKS:
        value = ratios.get(key)
        if value is not None and key in bounds and value > bounds[key]:
            failures.append(f"{key} = {value:g} exceeds the bound {bounds[key]:g}")
    return failures


def describe_targets(bounds: dict) -> str:
    """The bounds in words, for the soak's verdict line."""
    words = {"rss_growth": "RSS growth", "p99_drift": "P99 drift", "p50_drift": "P50 drift",
             "p99_drift_thirds": "P99 drift (median of thirds)"}
    parts = [f"{words[k]} <= {v:.0%}" for k, v in bounds.items() if k in words]
    if all(k in bounds for k in _COUNT_CHECKS):
        parts.append("no arena fragmentation alarm or fragmentation failure")
    return ", ".join(parts)


def _count(value: Optional[float]) -> str:
    return "not exported" if value is None else f"{value:g}"


def format_ratios(ratios: dict) -> List[str]:
    def pct(v):
        return "not exported" if v is None else f"{v:+.1%}"
    return [f"tritonserver RSS growth, first -> last window: {pct(ratios['server_rss_growth'])}",
            f"Python stubs RSS growth, first -> last window:  {pct(ratios['stubs_rss_growth'])}",
            f"P99 drift, first -> last window:                {pct(ratios['p99_drift'])}",
            f"P99 drift, median of first -> last third:       {pct(ratios['p99_drift_thirds'])}",
            f"P50 drift, first -> last window:                {pct(ratios['p50_drift'])}",
            *([f"control's P99 drift, first -> last window:      {pct(ratios['control_p99_drift'])}",
               f"P99 drift against the control's:                {pct(ratios['p99_drift_vs_control'])}",
               f"P99 drift against the control's, thirds:        {pct(ratios['p99_drift_thirds_vs_control'])}"]
              if "p99_drift_vs_control" in ratios else []),
            f"throughput change, first -> last window:        {pct(ratios['throughput_change'])}",
            "arena fragmentation alarm, windows raised:      "
            + _count(ratios.get("fragmented_windows")),
            "arena fragmentation failures:                   " + _count(ratios.get("fragmentation_failures")),
            "arena largest free block vs P99 request, last:  "
            + ("not exported" if ratios.get("largest_free_last") is None or ratios.get("p99_request_last") is None
               else f"{ratios['largest_free_last'] / 2**10:,.0f} KiB vs {ratios['p99_request_last'] / 2**10:,.1f} KiB"),
            "1 - largest free / free, first -> last window:  "
            + ("not exported" if ratios["fragmentation_last"] is None else
               f"{ratios['fragmentation_first']:.1%} -> {ratios['fragmentation_last']:.1%} (descriptive)"),
            f"arena reserved growth:                          {pct(ratios['arena_reserved_growth'])}"]
