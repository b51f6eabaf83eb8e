"""`latte bench`: a concurrency sweep and a Poisson request-rate sweep with perf_analyzer."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from latte.bench.inputs import fetch_model_inputs, write_perf_input_data
from latte.bench.lengths import LengthDistribution
from latte.bench.prometheus_scrape import MetricsSampler, Sample
from latte.bench.results import machine_description
from latte.bench.target import Target
from latte.bench.triton_stats import fetch_stats
from latte.triton.perf import PerfAnalyzerError, run_perf_analyzer

# Request rates of the Poisson sweep, as fractions of the best throughput the concurrency sweep saw.
DEFAULT_RATE_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


@dataclass
class BenchSettings:
    model: str
    protocol: str = "grpc"
    concurrency: Sequence[int] = (1, 2, 4, 8)
    request_rates: Optional[Sequence[float]] = None   # None: fractions of the measured peak
    lengths: LengthDistribution = field(default_factory=lambda: LengthDistribution.parse("lognormal"))
    samples: int = 256
    measurement_ms: int = 1500
    max_trials: int = 4
    stability_percentage: float = 50.0
    sample_interval_s: float = 0.5
    seed: int = 0

    def validate(self) -> None:
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"concurrency levels must be >= 1, got {list(self.concurrency)}")
        if self.request_rates is not None and (not self.request_rates or min(self.request_rates) <= 0):
            raise ValueError(f"request rates must be > 0 per second, got {list(self.request_rates)}")
        if self.samples < 1:
            raise ValueError(f"--samples must be >= 1, got {self.samples}")
        if self.measurement_ms < 100:
            raise ValueError(f"--measurement-ms must be >= 100, got {self.measurement_ms}")


ProgressHook = Callable[[str], None]


# When perf_analyzer cannot settle within the stability asked for (bursty Poisson load on a
# shared machine), the point is measured once more with a bound loose enough to settle and marked so.
RELAXED_STABILITY = 400.0


def _perf_point(target: Target, settings: BenchSettings, input_data: Path, kind: str, level: float,
                stability: float) -> dict:
    kwargs = {"concurrency": [int(level)]} if kind == "concurrency" else {
        # Asynchronous sends keep up the offered rate; synchronous ones are capped by perf_analyzer's threads.
        "request_rate": [level], "extra_args": ["--request-distribution", "poisson", "--async"]}
    measured = run_perf_analyzer(settings.model, target.url_for(settings.protocol), settings.protocol,
                                 input_data=input_data, measurement_ms=settings.measurement_ms,
                                 max_trials=settings.max_trials, stability_percentage=stability, **kwargs)
    if not measured:
        raise PerfAnalyzerError("perf_analyzer wrote an empty report")
    point = {k: v for k, v in measured[0].as_dict().items() if k not in ("concurrency", "request_rate")}
    point["stability_percentage"] = stability
    return point


def _measure(target: Target, settings: BenchSettings, sampler: MetricsSampler, input_data: Path, kind: str,
             level: float) -> dict:
    before = fetch_stats(target.http_url, settings.model)
    started = sampler.elapsed()
    point = {"kind": kind, "level": level, "t_start": round(started, 3)}
    try:
        try:
            point.update(_perf_point(target, settings, input_data, kind, level, settings.stability_percentage))
        except PerfAnalyzerError as exc:
            if "stable measurement" not in str(exc) or settings.stability_percentage >= RELAXED_STABILITY:
                raise
            point.update(_perf_point(target, settings, input_data, kind, level, RELAXED_STABILITY))
    except PerfAnalyzerError as exc:
        point["error"] = str(exc)
    point["t_end"] = round(sampler.elapsed(), 3)
    point["server"] = fetch_stats(target.http_url, settings.model).minus(before).as_dict()
    return point


def run_bench(target: Target, settings: BenchSettings, progress: Optional[ProgressHook] = None,
              total_hook: Optional[Callable[[int], None]] = None) -> dict:
    """Run both sweeps against `target` and return the results (what results.json holds)."""
    settings.validate()
    say = progress or (lambda message: None)
    model_inputs = fetch_model_inputs(target.http_url, settings.model)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"latte-bench-{os.getpid()}-{settings.model}.json"
    input_data, drawn = write_perf_input_data(work, model_inputs, settings.lengths, settings.samples, settings.seed)
    points: List[dict] = []
    started = time.time()
    levels = sorted(set(int(c) for c in settings.concurrency))
    rates_given = settings.request_rates is not None
    if total_hook:
        total_hook(len(levels) + (len(settings.request_rates) if rates_given else len(DEFAULT_RATE_FRACTIONS)))
    try:
        with MetricsSampler(target.metrics_url, target.server_pid, settings.sample_interval_s) as sampler:
            for c in levels:
                say(f"{settings.model}: concurrency {c}")
                points.append(_measure(target, settings, sampler, input_data, "concurrency", c))
            if rates_given:
                rates = sorted(float(r) for r in settings.request_rates)
            else:
                peak = max((p.get("throughput", 0.0) for p in points), default=0.0)
                rates = [round(max(1.0, f * peak), 1) for f in DEFAULT_RATE_FRACTIONS]
            for r in rates:
                say(f"{settings.model}: Poisson {r:g} req/s")
                points.append(_measure(target, settings, sampler, input_data, "request_rate", r))
        samples: List[Sample] = sampler.samples()
    finally:
        work.unlink(missing_ok=True)
    return {
        "model": settings.model,
        "protocol": settings.protocol,
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": machine_description(),
        "server": {"http_url": target.http_url, "started_here": target.started_here, "pid": target.server_pid},
        "lengths": {"distribution": settings.lengths.describe(), "variable": model_inputs.variable,
                    "max_length": model_inputs.max_length, "drawn": drawn},
        "settings": {"concurrency": levels, "request_rates": rates, "samples": settings.samples,
                     "measurement_ms": settings.measurement_ms, "max_trials": settings.max_trials,
                     "stability_percentage": settings.stability_percentage},
        "points": points,
        "summary": summarize(points, samples, settings.model),
        "samples": [s.as_dict() for s in samples],
        "sampler_errors": sampler.errors,
    }


def summarize(points: List[dict], samples: List[Sample], model: Optional[str] = None) -> dict:
    """Headline figures; memory counts tritonserver and the stubs serving `model` (all stubs if None)."""
    ok = [p for p in points if "error" not in p]
    summary: dict = {"points": len(points), "failed_points": len(points) - len(ok)}
    if ok:
        best = max(ok, key=lambda p: p["throughput"])
        lightest = min(ok, key=lambda p: p["throughput"])
        summary.update({
            "peak_throughput": round(best["throughput"], 1),
            "peak_at": f"{best['kind']} {best['level']:g}",
            "p99_ms_at_peak": round(best["p99_ms"], 2),
            "p50_ms_light_load": round(lightest["p50_ms"], 2),
            "p99_ms_light_load": round(lightest["p99_ms"], 2),
            "mean_batch_size_at_peak": best["server"]["mean_batch_size"],
            "largest_batch": max((int(k) for p in ok for k in p["server"]["batch_size_counts"]), default=0),
        })
    if len(samples) >= 2 and samples[0].rss:
        first, last = samples[0], samples[-1]
        summary.update({
            "server_rss_mb_start": round(first.server_rss / 2**20, 1),
            "server_rss_mb_end": round(last.server_rss / 2**20, 1),
            "stubs_rss_mb_start": round(_stubs(first, model) / 2**20, 1),
            "stubs_rss_mb_end": round(_stubs(last, model) / 2**20, 1),
        })
    return summary


def _stubs(sample: Sample, model: Optional[str]) -> int:
    from latte.bench.soak import model_stubs

    return sum(model_stubs(sample.rss, model).values()) if model else sample.stubs_rss


def write_results(results: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    return path
