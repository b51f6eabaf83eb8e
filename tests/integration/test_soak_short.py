"""A short soak in the default suite: 20k variable-length requests must leave memory and latency flat.

Bounds (looser than the 1M-request targets of docs/benchmarks.md, see SHORT_TARGETS): RSS of
tritonserver and of the model's stub +5 % at most, P50 drift +100 %, P99 drift (median of the first
third of the windows against the last third) +300 %, and, when exported, the arena's fragmentation
alarm never raised and no fragmentation failure (docs/memory.md).
The P99 bound only catches a blow-up: on the shared 2-core CI machine a window's P99 over 1000
requests moves by 2-4x with the neighbours' load, P50 by up to 1.5x, while memory stays put.
"""

from latte.bench.lengths import LengthDistribution
from latte.bench.soak import SHORT_TARGETS, SoakSettings, check_ratios, format_ratios, run_soak
from latte.bench.target import Target


def test_twenty_thousand_variable_length_requests_leave_memory_and_latency_flat(server):
    target = Target(server.http_url, server.grpc_url, server.metrics_url, server.process.pid, started_here=True)
    settings = SoakSettings("sequence_onnx", requests=20_000, windows=20, in_flight=4, warmup_requests=1000,
                            lengths=LengthDistribution.parse("lognormal:median=24,sigma=0.8"))
    result = run_soak(target, settings)
    print("\n".join(format_ratios(result["ratios"])))
    assert result["answered"] == result["requests"] == 21_000
    assert result["failed"] == 0, result["errors"]
    assert all(w["requests"] == 1000 and w["server_rss_mb"] > 0 and w["stubs_rss_mb"] > 0 for w in result["windows"])
    assert check_ratios(result["ratios"], SHORT_TARGETS) == []
    # The forecast of P95 against uptime: one of the two fits, over every window, with its words.
    forecast = result["forecast"]
    assert forecast["kind"] in ("linear", "quadratic") and forecast["now_s"] == result["windows"][-1]["t"]
    assert forecast["text"].startswith(("no upward trend", "upward trend", "P95 projected to cross"))
    assert all(w["p50_ms"] <= w["p95_ms"] <= w["p99_ms"] for w in result["windows"])
