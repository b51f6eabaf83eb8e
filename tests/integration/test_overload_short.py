"""A short overload step in the default suite: 3x capacity, two priority classes, abandoned sessions.

Checks: every request sent got exactly one answer (success or error); the server's queue sheds
low-priority requests and never a high-priority one, and high-priority requests are not starved
(their median, not their tail: see HIGH_MEDIAN_MS); the server is ready afterwards,
every arena block and session the step took is given back, and memory is back near the pre-step
baseline: the model's stub within 10 %, tritonserver within 40 % (see SERVER_RSS_GROWTH; the
30 s run of benchmarks/overload.py gives the figures).
"""

import json
import time

import pytest

from latte.bench.arena import arena_figures
from latte.bench.lengths import LengthDistribution
from latte.bench.overload import OverloadSettings, run_overload, write_overload_repository
from latte.bench.prometheus_scrape import scrape
from latte.bench.target import Target
from latte.triton import TritonServer

from conftest import assert_stopped_promptly

MODEL = "sequence_onnx"
# What the load generator records for a request it had no slot for: not sent, so not the server's shedding.
CLIENT_SHED = "client in-flight limit reached"
# Each run measures capacity afresh; one measured while the model was cold or neighbours held
# the cores makes "3x" no overload (the server's queue sheds nothing), and the step runs again.
ATTEMPTS = 3
# A tenth of the step at high priority, 0.3x the capacity measured: that measurement, 3 s in
# closed loop, ranged over 135-406 req/s across our runs on a quiet or busy box, and a high class
# above what the server then sustains queues without end (it is never shed), whatever the priority.
HIGH_SHARE = 0.1
# The high class's tail is the benchmark's objective (500 ms), not a bound here: one instance
# serves it, which Triton 2.51's batcher stalls ~500 ms at a time behind priority levels
# (docs/backend.md, Priorities), more often on a busy box, and a stall holds every high request
# that arrives meanwhile, so one stall in the step can make the P99. Its median is held instead:
# 10-14 ms quiet, 15-32 ms with one of the 2 cores busy (114-486 ms at twice HIGH_SHARE), far
# below the 6 s step that high requests starved behind the low class would wait out.
HIGH_MEDIAN_MS = 1000
# glibc keeps part of what the step's queued requests used, more when a slow box keeps more of
# them queued at once (the client's 512 in flight bound it): of a ~47 MiB tritonserver, +2-6 %
# quiet or with one of the 2 cores busy, +30 % once at twice HIGH_SHARE on the busy box. Each
# request carries 8 KiB of tokens: a server that kept them would grow by 20 MiB (over 40 %)
# across a step's 2,500 or more requests.
SERVER_RSS_GROWTH = 0.40


@pytest.fixture(scope="module")
def overload_server(example_repo, tmp_path_factory):
    root = tmp_path_factory.mktemp("overload")
    repo = write_overload_repository(example_repo, MODEL, root / "repo", queue_timeout_us=100_000, max_queue_size=64)
    with TritonServer(repo, log_path=root / "log") as server:
        yield server
    assert_stopped_promptly(server)


def server_shed(report: dict) -> int:
    """Requests of one class that the server refused (its queue's timeout or size)."""
    return sum(count for kind, count in report["errors"].items() if kind != CLIENT_SHED)


def arena_live_bytes(server, within_s: float = 10.0) -> float:
    """The model's live arena bytes once they reach 0, else after within_s: the backend
    publishes its figures about once a second, so the first scrape may predate the last answer."""
    deadline = time.monotonic() + within_s
    while True:
        live = arena_figures(scrape(server.metrics_url), MODEL)["arena_live_bytes"]
        if live == 0 or time.monotonic() > deadline:
            return live
        time.sleep(0.5)


def test_the_variant_config_has_two_priority_levels_and_a_shedding_queue(overload_server):
    config = (overload_server.repository / MODEL / "config.pbtxt").read_text()
    assert "priority_levels: 2" in config and "default_priority_level: 2" in config
    assert "timeout_action: REJECT" in config and "max_queue_size: 64" in config
    assert "priority_queue_policy" in config and "timeout_action: DELAY" in config  # level 1 is never shed
    assert 'key: "session_input"' in config and 'key: "session_ttl_s"' in config


def test_a_three_times_capacity_step_sheds_only_low_priority(overload_server):
    server = overload_server
    target = Target(server.http_url, server.grpc_url, server.metrics_url, server.process.pid, started_here=True)
    for _ in range(ATTEMPTS):
        settings = OverloadSettings(MODEL, capacity_s=3, baseline_s=3, step_s=6, recovery_s=3, overload=3.0,
                                    high_share=HIGH_SHARE, high_slo_ms=500, abandoned_sessions=16,
                                    lengths=LengthDistribution.parse("fixed:length=128"))
        result = run_overload(target, settings)
        print(json.dumps({k: v for k, v in result.items() if k != "memory"}, indent=1))
        if server_shed(result["per_phase"]["step"]["low"]):
            break
    whole = result["whole_run"]
    assert whole["every_request_answered_once"], whole
    step = result["per_phase"]["step"]
    for cls in ("high", "low"):
        assert step[cls]["answered"] == step[cls]["sent"] == step[cls]["succeeded"] + step[cls]["failed"]
    # The overload fell on the low class: its queue shed, level 1's policy never does. The
    # client's own limit, when a slow box fills it, sheds both classes alike.
    assert server_shed(step["low"]) > 0, step["low"]
    assert server_shed(step["high"]) == 0, step["high"]
    assert step["low"]["shed_rate"] > step["high"]["shed_rate"]
    assert step["high"]["p50_ms"] <= HIGH_MEDIAN_MS, step["high"]
    assert result["server_alive_after"]
    # The vanished clients' sessions were open during the step and reclaimed by their idle TTL.
    assert result["abandoned_sessions"] == 16
    assert result["sessions_peak"] >= 16 and result["live_sessions_after"] == 0
    assert arena_live_bytes(server) == 0      # every block the step's batches and sessions took is back
    assert result["memory_return"]["server_rss_after_vs_baseline"] <= SERVER_RSS_GROWTH, result["memory"]
    assert result["memory_return"]["stubs_rss_after_vs_baseline"] <= 0.10, result["memory"]
