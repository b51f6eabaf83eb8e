"""A short overload step in the default suite: 3x capacity, two priority classes, abandoned sessions.

Checks: every request sent got exactly one answer (success or error); the high-priority class
keeps a P99 of 1 s through the step (the benchmark's objective is 500 ms; the CI machine's
neighbours alone move this tail by hundreds of ms) while the low-priority class absorbs the shedding; the
server is ready afterwards and its memory is back near the pre-step baseline: the model's stub
within 10 %, tritonserver within 20 % (a few MiB on a ~45 MiB process: glibc keeps part of what
the step's queued requests used; the 30 s run of benchmarks/overload.py gives the figure).
"""

import json

import pytest

from latte.bench.lengths import LengthDistribution
from latte.bench.overload import OverloadSettings, run_overload, write_overload_repository
from latte.bench.target import Target
from latte.triton import TritonServer

MODEL = "sequence_onnx"


@pytest.fixture(scope="module")
def overload_server(example_repo, tmp_path_factory):
    root = tmp_path_factory.mktemp("overload")
    repo = write_overload_repository(example_repo, MODEL, root / "repo", queue_timeout_us=100_000, max_queue_size=64)
    with TritonServer(repo, log_path=root / "log") as server:
        yield server


def test_the_variant_config_has_two_priority_levels_and_a_shedding_queue(overload_server):
    config = (overload_server.repository / MODEL / "config.pbtxt").read_text()
    assert "priority_levels: 2" in config and "default_priority_level: 2" in config
    assert "timeout_action: REJECT" in config and "max_queue_size: 64" in config
    assert "priority_queue_policy" in config and "timeout_action: DELAY" in config  # level 1 is never shed
    assert 'key: "session_input"' in config and 'key: "session_ttl_s"' in config


def test_a_three_times_capacity_step_keeps_high_priority_within_its_slo(overload_server):
    server = overload_server
    target = Target(server.http_url, server.grpc_url, server.metrics_url, server.process.pid, started_here=True)
    for overload in (3.0, 5.0):
        settings = OverloadSettings(MODEL, capacity_s=3, baseline_s=3, step_s=6, recovery_s=3, overload=overload,
                                    high_share=0.2, high_slo_ms=1000, abandoned_sessions=16,
                                    lengths=LengthDistribution.parse("fixed:length=128"))
        result = run_overload(target, settings)
        print(json.dumps({k: v for k, v in result.items() if k != "memory"}, indent=1))
        shed = result["per_phase"]["step"]["low"]["shed_rate"] + result["per_phase"]["step"]["high"]["shed_rate"]
        # A capacity measured while neighbours held the cores makes "3x" no overload at all
        # (nothing shed, nothing to attribute); the step is then run again at 5x.
        if shed > 0:
            break
    whole = result["whole_run"]
    assert whole["every_request_answered_once"], whole
    step = result["per_phase"]["step"]
    for cls in ("high", "low"):
        assert step[cls]["answered"] == step[cls]["sent"] == step[cls]["succeeded"] + step[cls]["failed"]
    assert step["high"]["slo_held"], step["high"]
    assert step["high"]["shed_rate"] <= 0.02, step["high"]
    assert step["low"]["shed_rate"] > step["high"]["shed_rate"]      # the overload fell on the low class
    assert result["server_alive_after"]
    # The vanished clients' sessions were open during the step and reclaimed by their idle TTL.
    assert result["abandoned_sessions"] == 16
    assert result["sessions_peak"] >= 16 and result["live_sessions_after"] == 0
    assert result["memory_return"]["server_rss_after_vs_baseline"] <= 0.20
    assert result["memory_return"]["stubs_rss_after_vs_baseline"] <= 0.10
