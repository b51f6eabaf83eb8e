"""report.html: self-contained, summary first, one captioned PNG per figure."""

import base64
import re

from latte.bench.report import render_bench_report
from latte.bench.runner import summarize
from latte.bench.prometheus_scrape import Sample


def _point(kind, level, throughput, p99, batches):
    return {"kind": kind, "level": level, "t_start": level, "t_end": level + 1, "throughput": throughput,
            "p50_ms": p99 / 3, "p90_ms": p99 / 1.5, "p95_ms": p99 / 1.2, "p99_ms": p99, "avg_ms": p99 / 2.5,
            "queue_us": 100.0 * level, "compute_us": 800.0,
            "server": {"mean_batch_size": sum(int(k) * v for k, v in batches.items()) / sum(batches.values()),
                       "batch_size_counts": batches}}


def _results():
    points = [_point("concurrency", 1, 400.0, 3.0, {"1": 800}), _point("concurrency", 4, 1100.0, 6.5, {"2": 300, "4": 400}),
              _point("request_rate", 275, 274.0, 3.4, {"1": 500, "2": 20}),
              {"kind": "request_rate", "level": 1100, "t_start": 9, "t_end": 10, "error": "perf_analyzer failed (exit 1)",
               "server": {"mean_batch_size": 0, "batch_size_counts": {}}}]
    samples = [Sample(t, {"latte_arena_reserved_bytes": 1024.0}, {"tritonserver": (300 + t) * 2**20,
                                                                  "stub:41:mlp_onnx_0_0": 500 * 2**20})
               for t in (0.0, 0.5, 1.0, 1.5)]
    return {"model": "mlp_onnx", "protocol": "grpc", "started_at": "2026-11-21 10:00:00", "duration_s": 12.0,
            "machine": "Linux x86_64, 2 cores", "lengths": {"distribution": "lognormal:median=24", "variable": True,
                                                            "max_length": 128},
            "settings": {"measurement_ms": 1500, "max_trials": 4, "stability_percentage": 50, "samples": 256},
            "points": points, "summary": summarize(points, samples), "samples": [s.as_dict() for s in samples]}


def test_summary_picks_the_peak_and_the_light_load_point():
    summary = _results()["summary"]
    assert summary["peak_throughput"] == 1100.0 and summary["peak_at"] == "concurrency 4"
    assert summary["p99_ms_light_load"] == 3.4          # the Poisson point at 274/s was the lightest
    assert summary["failed_points"] == 1 and summary["largest_batch"] == 4
    assert summary["server_rss_mb_start"] == 300.0 and summary["server_rss_mb_end"] == 301.5


def test_the_report_is_self_contained_with_the_summary_before_the_figures():
    html = render_bench_report(_results())
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert html.index("Peak throughput") < html.index("<img")
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(images) == 5  # latency-throughput, percentiles, queue/compute split, batch sizes, memory
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert html.count("<figcaption>") == len(images)
    assert "perf_analyzer failed (exit 1)" in html and "1 failed" in html
    assert "latte_arena_reserved_bytes" in html
