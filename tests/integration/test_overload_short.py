"""A short overload step in the default suite: 3x capacity, two priority classes, abandoned sessions.

Checks: every request sent got exactly one answer (success or error); the server's queue sheds
low-priority requests and never a high-priority one, and high-priority requests are served ahead
of the low class's (their median below its, see the step's test); the server is ready afterwards,
every arena block and session the step took is given back, and neither tritonserver nor the
model's stub kept the step's requests (see KEPT_SHARE; the 30 s run of benchmarks/overload.py
gives the figures).
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
# the cores makes "3x" no overload (the server's queue sheds little or nothing), and the step
# runs again. An overloaded step keeps the low class's queue full: whatever the box, it sheds
# the low class's excess, 0.73 of it on a quiet box at 3x; a full test run on the 2-core box,
# its neighbours holding the cores, measured 0.07. A twentieth shed means the queue filled
# for much of the step, so its requests waited their turn behind it.
ATTEMPTS = 3
OVERLOADED_SHED = 0.05
# A tenth of the step at high priority, 0.3x the capacity measured: that measurement, 3 s in
# closed loop, ranged over 135-406 req/s across our runs on a quiet or busy box, and a high class
# above what the server then sustains queues without end (it is never shed), whatever the priority.
HIGH_SHARE = 0.1
# Each request carries 8 rows of 128 int64 tokens. A process that kept each of the step's
# requests grows by at least the bytes they carried (12,000 requests, 94 MiB, on a quiet box;
# 2,400, 19 MiB, where capacity measured 135 req/s). What glibc keeps of the step's queued
# requests is bounded by how many were queued at once (the client's 512 in flight), not by how
# many were sent: tritonserver grew 9 MiB (19 %) on a quiet box, the stub under 1 %. So each
# process's growth is held to half the bytes the step's requests carried, a bound that a busy
# box, which sends fewer requests and queues no more at once, leaves as wide.
REQUEST_BYTES = 8 * 128 * 8
KEPT_SHARE = 0.5


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


def server_shed_rate(report: dict) -> float:
    return server_shed(report) / report["sent"] if report["sent"] else 0.0


def test_a_three_times_capacity_step_sheds_only_low_priority(overload_server):
    server = overload_server
    target = Target(server.http_url, server.grpc_url, server.metrics_url, server.process.pid, started_here=True)
    for _ in range(ATTEMPTS):
        settings = OverloadSettings(MODEL, capacity_s=3, baseline_s=3, step_s=6, recovery_s=3, overload=3.0,
                                    high_share=HIGH_SHARE, high_slo_ms=500, abandoned_sessions=16,
                                    lengths=LengthDistribution.parse("fixed:length=128"))
        result = run_overload(target, settings)
        print(json.dumps({k: v for k, v in result.items() if k != "memory"}, indent=1))
        if server_shed_rate(result["per_phase"]["step"]["low"]) >= OVERLOADED_SHED:
            break
    whole = result["whole_run"]
    assert whole["every_request_answered_once"], whole
    step = result["per_phase"]["step"]
    for cls in ("high", "low"):
        assert step[cls]["answered"] == step[cls]["sent"] == step[cls]["succeeded"] + step[cls]["failed"]
    # The overload fell on the low class: its queue shed, level 1's policy never does. The
    # client's own limit, when a slow box fills it, sheds both classes alike.
    assert server_shed_rate(step["low"]) >= OVERLOADED_SHED, step["low"]
    assert server_shed(step["high"]) == 0, step["high"]
    assert step["low"]["shed_rate"] > step["high"]["shed_rate"]
    # Served ahead of the low class's full queue, not starved behind it: its median below the
    # low class's (10-32 ms against 90 ms or more, the low requests that waited their turn).
    assert step["high"]["succeeded"] > 0 and step["high"]["p50_ms"] < step["low"]["p50_ms"], step
    assert result["server_alive_after"]
    # The vanished clients' sessions were open during the step and reclaimed by their idle TTL.
    assert result["abandoned_sessions"] == 16
    assert result["sessions_peak"] >= 16 and result["live_sessions_after"] == 0
    assert arena_live_bytes(server) == 0      # every block the step's batches and sessions took is back
    carried_mib = (step["high"]["sent"] + step["low"]["sent"]) * REQUEST_BYTES / 2**20
    memory = result["memory"]
    for process in ("server", "stubs"):
        grown = memory["after"][f"{process}_rss_mb"] - memory["baseline"][f"{process}_rss_mb"]
        assert grown <= KEPT_SHARE * carried_mib, (process, grown, carried_mib, memory)
