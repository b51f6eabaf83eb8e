"""When latency will cross the SLO: fits against uptime chosen on held-out samples, and what
`latte watch` makes of two scrapes of a server's metrics."""

import math

import numpy as np
import pytest

from latte.bench.forecast import MIN_SAMPLES, fit_latency
from latte.bench.watch import Watcher, quantile

HOUR = 3600.0


def test_a_straight_rise_is_fitted_as_a_line_and_projected_to_its_crossing():
    uptime = np.arange(12) * 600.0                       # every 10 minutes for 2 hours
    p95 = 40.0 + 10.0 * uptime / HOUR                     # +10 ms an hour
    forecast = fit_latency(uptime, p95, slo_ms=100.0)
    assert forecast.kind == "linear" and forecast.upward
    assert forecast.crossing_s == pytest.approx(6 * HOUR)  # 40 + 10 h = 100 at 6 h of uptime
    assert forecast.text().startswith("P95 projected to cross the 100 ms SLO in 4.17 h (at 6 h of uptime)")


def test_latency_that_bends_upward_is_fitted_as_a_quadratic():
    # The seed's table (89 ms after 5 minutes, 112 after 30, 167 after 120), sampled along its curve.
    minutes = np.array([5, 15, 30, 45, 60, 75, 90, 105, 120, 135, 150, 165], dtype=float)
    p95 = 87.0 + 0.3 * minutes + 0.003 * minutes ** 2
    forecast = fit_latency(minutes * 60, p95, slo_ms=250.0)
    assert forecast.kind == "quadratic"
    assert forecast.held_out_rmse_ms["quadratic"] < forecast.held_out_rmse_ms["linear"]
    crossing_min = forecast.crossing_s / 60
    assert 87.0 + 0.3 * crossing_min + 0.003 * crossing_min ** 2 == pytest.approx(250.0, rel=1e-3)


def test_a_flat_noisy_run_has_no_upward_trend():
    rng = np.random.default_rng(4)
    uptime = np.arange(40) * 90.0
    forecast = fit_latency(uptime, 20.0 + rng.normal(0, 0.5, 40), slo_ms=50.0)
    assert not forecast.upward
    assert forecast.text().startswith("no upward trend:")


def test_too_few_samples_are_refused():
    with pytest.raises(ValueError, match=f"at least {MIN_SAMPLES} samples, got 3"):
        fit_latency([0, 1, 2], [1, 2, 3], slo_ms=10)


def test_quantiles_interpolate_within_buckets_as_prometheus_does():
    buckets = [(50_000.0, 900.0), (200_000.0, 1000.0), (math.inf, 1000.0)]
    assert quantile(0.5, buckets) == pytest.approx(50_000 * 500 / 900)
    assert quantile(0.95, buckets) == pytest.approx(50_000 + 150_000 * 50 / 100)
    assert math.isnan(quantile(0.5, [(100.0, 0.0), (math.inf, 0.0)]))


def scrape(requests: float, fast: float, failed: float = 0.0) -> dict:
    """A server's figures for model m: `requests` answered so far, `fast` of them under 10 ms."""
    return {'latte_requests_total{model="m",outcome="success"}': requests - failed,
            'latte_requests_total{model="m",outcome="model_error"}': failed,
            'latte_request_duration_us_bucket{model="m",priority="0",le="10000"}': fast,
            'latte_request_duration_us_bucket{model="m",priority="0",le="40000"}': requests,
            'latte_request_duration_us_bucket{model="m",priority="0",le="+Inf"}': requests,
            'latte_arena_bytes{model="m",state="live"}': 2 ** 20, 'latte_arena_bytes{model="m",state="allocated"}': 2 ** 21,
            'latte_resident_memory_bytes{model="m",instance="m_0_0"}': 300 * 2 ** 20,
            'nv_inference_pending_request_count{model="m",version="1"}': 3}


def test_the_watch_shows_the_figures_between_two_scrapes():
    seconds = iter([0.0, 10.0])
    watcher = Watcher(slo_ms=100.0, clock=lambda: next(seconds))
    assert watcher.add(scrape(1000, 1000)) == []                   # figures need two scrapes
    (row,) = watcher.add(scrape(2000, 1800, failed=50))             # 1000 more, 800 of them fast, 50 failed
    assert row["req/s"] == "100.0" and row["errors/s"] == "5.00"
    assert row["P50 ms"] == "6.25"                                  # 500th of 800 in [0, 10) ms
    assert row["P95 ms"] == "32.50"                                 # 950th: 150/200 of [10, 40) ms
    assert row["queue"] == "3" and row["arena live / held MiB"] == "1.0 / 2.0" and row["RSS MiB"] == "300"
    assert row["forecast"] == f"(1/{MIN_SAMPLES} samples)"


def test_the_watch_forecasts_once_it_has_enough_samples():
    ticks = iter(range(0, 10_000, 600))
    watcher = Watcher(slo_ms=30.0, clock=lambda: float(next(ticks)))
    total, fast = 0.0, 0.0
    watcher.add(scrape(total, fast))
    for step in range(MIN_SAMPLES + 2):
        # P95 climbs 2 ms every 10 minutes from 15 ms: the share of requests over 10 ms that puts
        # the 950th of 1,000 at that point of the [10, 40) ms bucket.
        share = (15.0 + 2 * step - 10.0) / 30.0
        total += 1000
        fast += (950 - 1000 * share) / (1 - share)
        rows = watcher.add(scrape(total, fast))
    assert rows[0]["P95 ms"] == "29.00"
    assert rows[0]["forecast"].startswith("P95 projected to cross the 30 ms SLO in 0.0833 h")   # 2 ms more: 5 min
