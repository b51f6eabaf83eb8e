"""The supervisor of `latte serve`, without a tritonserver: its restart policy, its health rules
and the figures they judge, the model processes it reads from /proc, its endpoint, and its loop
driven step by step over a fake server, a fake repository and a fake clock."""

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from latte.bench.prometheus_scrape import parse_prometheus
from latte.supervision import processes, state
from latte.supervision import supervisor as supervisor_module
from latte.supervision.flight import FlightRecorder
from latte.supervision.health import HealthEndpoint, liveness, metrics_text, readiness
from latte.supervision.poison import REFUSE_AFTER, PoisonList, input_digest
from latte.supervision.policy import PolicyError, RestartBudget, RestartPolicy
from latte.supervision.processes import ProcessState, StubProcess
from latte.supervision.repository import LoadOutcome
from latte.supervision.rules import (DEFAULT_EXECUTE_TIMEOUT_S, MIN_REQUESTS_FOR_P99, HealthRules, RuleError,
                                     Vitals, histogram_quantile)
from latte.supervision.supervisor import DOWN, RESTARTING, SERVING, ModelView, Snapshot, Supervisor
from latte.supervision.vitals_metrics import model_figures
from latte.triton.security import ADMIN_HEADER

MIB = 1 << 20


def digest(value):
    return input_digest([("x", np.array([value], np.float32))])


# --- policy ---------------------------------------------------------------------------------------

def test_the_first_restart_is_at_once_and_each_further_one_waits_twice_as_long_up_to_the_cap():
    budget = RestartBudget(RestartPolicy(max_restarts=6, window_s=100.0, backoff_base_s=1.0, max_delay_s=5.0))
    delays = []
    for now in range(6):
        delays.append(budget.next_delay(now))
        budget.spend(now)
    assert delays == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert budget.used(5.0) == 6


def test_a_model_is_given_up_after_its_restarts_within_the_window_and_older_ones_are_forgotten():
    budget = RestartBudget(RestartPolicy(max_restarts=3, window_s=100.0, backoff_base_s=1.0))
    for now in (0.0, 10.0, 20.0):
        assert budget.next_delay(now) is not None
        budget.spend(now)
    assert budget.next_delay(30.0) is None
    assert budget.used(30.0) == 3
    # The restart at 0 s is past the window at 100.5 s: one restart is left, after 2 s (two recent).
    assert budget.next_delay(100.5) == 2.0
    assert budget.used(100.5) == 2
    assert budget.next_delay(121.0) == 0.0 and budget.used(121.0) == 0


def test_a_first_delay_is_kept_and_no_restarts_at_all_gives_up_at_the_first_death():
    assert RestartBudget(RestartPolicy(first_delay_s=3.0)).next_delay(0.0) == 3.0
    assert RestartBudget(RestartPolicy(max_restarts=0)).next_delay(0.0) is None


@pytest.mark.parametrize("settings, words", [
    ({"max_restarts": -1}, "max restarts must be >= 0, got -1"),
    ({"window_s": 0.0}, "restart window must be > 0 seconds, got 0"),
    ({"backoff_base_s": -1.0}, "delays must be >= 0"),
    ({"max_delay_s": -1.0}, "delays must be >= 0"),
    ({"first_delay_s": -0.5}, "delays must be >= 0"),
])
def test_a_policy_that_cannot_work_is_refused(settings, words):
    with pytest.raises(PolicyError, match=words):
        RestartPolicy(**settings)
    assert issubclass(PolicyError, ValueError)


# --- rules ----------------------------------------------------------------------------------------

def config_with(**parameters):
    return {"name": "m", "parameters": {k: {"string_value": str(v)} for k, v in parameters.items()}}


def test_health_rules_are_read_from_the_configs_parameters():
    rules = HealthRules.of("m", config_with(execute_timeout_s=5, health_p99_slo_ms=25, health_p99_window_s=30,
                                            health_rss_growth_mib_per_min=8, health_rss_window_s=120,
                                            health_cpu_pegged_percent=95, health_cpu_pegged_s=60,
                                            health_fragmented_s=90, rejuvenate_min_interval_s=0))
    assert rules == HealthRules(execute_timeout_s=5.0, p99_slo_ms=25.0, p99_window_s=30.0,
                                rss_growth_mib_per_min=8.0, rss_window_s=120.0, cpu_pegged_percent=95.0,
                                cpu_pegged_s=60.0, fragmented_s=90.0, rejuvenate_min_interval_s=0.0)


def test_health_rules_default_when_the_config_says_nothing():
    assert HealthRules.of("m", {}) == HealthRules()
    rules = HealthRules.of("m", config_with(health_p99_slo_ms=" ", other="x"))
    assert rules.execute_timeout_s == DEFAULT_EXECUTE_TIMEOUT_S
    assert rules.p99_slo_ms is None and rules.rss_growth_mib_per_min is None and rules.cpu_pegged_percent is None
    # The server's execute limit (latte serve --execute-timeout) is the default a model's own parameter overrides.
    assert HealthRules.of("m", {}, execute_timeout_s=20.0).execute_timeout_s == 20.0
    assert HealthRules.of("m", config_with(execute_timeout_s=7), execute_timeout_s=20.0).execute_timeout_s == 7.0


@pytest.mark.parametrize("key, raw, words", [
    ("health_p99_slo_ms", "fast", "must be a number, got 'fast'"),
    ("execute_timeout_s", "0.5", "must be >= 1, got '0.5'"),
    ("health_rss_window_s", "nan", "must be >= 1, got 'nan'"),
    ("health_cpu_pegged_percent", "-3", "must be >= 0, got '-3'"),
    ("rejuvenate_min_interval_s", "inf", "must be >= 0, got 'inf'"),
])
def test_a_bad_rule_names_the_model_and_its_parameter(key, raw, words):
    with pytest.raises(RuleError) as caught:
        HealthRules.of("encoder", config_with(**{key: raw}))
    message = str(caught.value)
    assert message.startswith(f"model 'encoder': parameters[\"{key}\"] ")
    assert words in message


def test_histogram_quantile_interpolates_within_the_bucket_as_prometheus_does():
    bounds = (10.0, 20.0, 40.0)
    counts = (10.0, 30.0, 40.0, 40.0)     # cumulative, +Inf last: 10 in (0,10], 20 in (10,20], 10 in (20,40]
    assert histogram_quantile(0.25, bounds, counts) == pytest.approx(10.0)   # rank 10: the first bucket's top
    assert histogram_quantile(0.5, bounds, counts) == pytest.approx(15.0)    # rank 20: half way through (10,20]
    assert histogram_quantile(0.99, bounds, counts) == pytest.approx(39.2)   # rank 39.6: 9.6 of 10 in (20,40]
    # A rank in the +Inf bucket is the highest finite bound.
    assert histogram_quantile(0.99, bounds, (10.0, 30.0, 40.0, 50.0)) == pytest.approx(40.0)
    assert histogram_quantile(0.99, bounds, (0.0, 0.0, 0.0, 0.0)) is None
    assert histogram_quantile(0.99, (), ()) is None


def test_rss_growing_faster_than_the_rule_trips_once_the_window_is_covered():
    vitals = Vitals(HealthRules(rss_growth_mib_per_min=10.0, rss_window_s=60.0))
    for now, mib in ((0, 100), (30, 115)):
        vitals.sample_process(now, mib * MIB, 0.0)
    assert vitals.verdict(30.0) is None        # 30 MiB/min, but over 30 s of the 60 the rule asks for
    vitals.sample_process(60, 130 * MIB, 0.0)
    assert vitals.verdict(60.0) == "RSS grew 30.0 MiB/min over 60 s (rule: at most 10 MiB/min)"

    slow = Vitals(HealthRules(rss_growth_mib_per_min=10.0, rss_window_s=60.0))
    for now, mib in ((0, 100), (30, 102), (60, 105)):
        slow.sample_process(now, mib * MIB, 0.0)
    assert slow.verdict(60.0) is None


def cpu_vitals(busy_by_interval, every_s=10.0):
    """Vitals sampled every `every_s` with the given CPU share (percent) in each interval."""
    vitals = Vitals(HealthRules(cpu_pegged_percent=90.0, cpu_pegged_s=30.0))
    used = 0.0
    vitals.sample_process(0.0, MIB, used)
    for i, busy in enumerate(busy_by_interval, 1):
        used += busy / 100.0 * every_s
        vitals.sample_process(i * every_s, MIB, used)
    return vitals


def test_cpu_pegged_trips_only_when_every_interval_of_the_window_is_above_the_threshold():
    assert cpu_vitals([95, 97, 99]).verdict(30.0) == "CPU above 90 % for 30 s (lowest 95 %; rule: 30 s)"
    assert cpu_vitals([95, 97]).verdict(20.0) is None           # the window is not covered yet
    assert cpu_vitals([95, 50, 99]).verdict(30.0) is None       # one interval below the threshold
    # A dip before the window does not count: from 20 s on, every interval is pegged.
    assert cpu_vitals([50, 95, 96, 97, 98]).verdict(50.0) == "CPU above 90 % for 30 s (lowest 96 %; rule: 30 s)"


BOUNDS_US = (1000.0, 5000.0, 20000.0)


def test_p99_over_the_slo_trips_with_enough_requests_in_the_window():
    vitals = Vitals(HealthRules(p99_slo_ms=10.0, p99_window_s=60.0))
    vitals.sample_metrics(0.0, (BOUNDS_US, (500.0, 500.0, 500.0, 500.0)), None)   # before the window: fast
    vitals.sample_metrics(30.0, (BOUNDS_US, (500.0, 505.0, 550.0, 550.0)), None)
    assert vitals.verdict(30.0) is None
    # In the window: 100 requests, 10 in (1,5] ms and 90 in (5,20] ms; P99 = 5 + 15 * 89/90 ms.
    vitals.sample_metrics(60.0, (BOUNDS_US, (500.0, 510.0, 600.0, 600.0)), None)
    assert vitals.verdict(60.0) == "P99 19.8 ms over the SLO 10 ms for 60 s (100 requests)"


def test_p99_is_not_judged_on_fewer_requests_nor_tripped_under_the_slo():
    few = Vitals(HealthRules(p99_slo_ms=10.0, p99_window_s=60.0))
    few.sample_metrics(0.0, (BOUNDS_US, (0.0, 0.0, 0.0, 0.0)), None)
    slow = MIN_REQUESTS_FOR_P99 - 1
    few.sample_metrics(60.0, (BOUNDS_US, (0.0, 0.0, float(slow), float(slow))), None)
    assert few.verdict(60.0) is None

    fast = Vitals(HealthRules(p99_slo_ms=10.0, p99_window_s=60.0))
    fast.sample_metrics(0.0, (BOUNDS_US, (0.0, 0.0, 0.0, 0.0)), None)
    fast.sample_metrics(60.0, (BOUNDS_US, (900.0, 1000.0, 1000.0, 1000.0)), None)
    assert fast.verdict(60.0) is None


def test_an_arena_fragmented_for_the_window_trips_and_an_alarm_cleared_starts_over():
    vitals = Vitals(HealthRules(fragmented_s=60.0))
    vitals.sample_metrics(0.0, None, True)
    vitals.sample_metrics(30.0, None, True)
    assert vitals.verdict(59.0) is None
    assert vitals.verdict(60.0) == "arena fragmented for 60 s (rule: 60 s)"
    vitals.sample_metrics(70.0, None, False)
    vitals.sample_metrics(80.0, None, True)
    vitals.sample_metrics(100.0, None, None)   # no figure this time: the alarm is still held since 80 s
    assert vitals.verdict(130.0) is None
    assert vitals.verdict(140.0) == "arena fragmented for 60 s (rule: 60 s)"

    off = Vitals(HealthRules(fragmented_s=None))
    off.sample_metrics(0.0, None, True)
    assert off.verdict(1000.0) is None


# --- the figures of latte's metrics ---------------------------------------------------------------

METRICS = """\
# HELP latte_request_duration_us Time from execute to response per request, by priority level
# TYPE latte_request_duration_us histogram
latte_request_duration_us_bucket{model="a",version="1",priority="0",le="+Inf"} 6
latte_request_duration_us_bucket{model="a",version="1",priority="0",le="1000"} 3
latte_request_duration_us_bucket{model="a",version="1",priority="0",le="5000"} 5
latte_request_duration_us_bucket{model="a",version="1",priority="1",le="1000"} 1
latte_request_duration_us_bucket{model="a",version="1",priority="1",le="5000"} 2
latte_request_duration_us_bucket{model="a",version="1",priority="1",le="+Inf"} 2
latte_request_duration_us_count{model="a",version="1",priority="0"} 6
latte_request_duration_us_bucket{le="1000"} 9
latte_arena_fragmented{model="a",version="1"} 0
latte_arena_fragmented{model="b",version="1"} 1
latte_request_duration_us_bucket{model="c",version="1",priority="0",le="1000"} 4
latte_request_duration_us_bucket{model="c",version="1",priority="0",le="+Inf"} 4
nv_inference_count{model="a",version="1"} 8
"""


def test_model_figures_sum_buckets_over_priorities_with_inf_last_and_read_the_fragmentation_alarm():
    figures = model_figures(parse_prometheus(METRICS, prefixes=("latte_",)))
    assert figures == {
        "a": (((1000.0, 5000.0), (4.0, 7.0, 8.0)), False),
        "b": (None, True),
        "c": (((1000.0,), (4.0, 4.0)), None),
    }


# --- processes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("status, words", [
    (signal.SIGKILL, "killed by signal 9 (SIGKILL)"),
    (signal.SIGSEGV | 0x80, "killed by signal 11 (SIGSEGV)"),   # with a core dumped
    (3 << 8, "exited with code 3"),
    (0, "exited with code 0"),
    (None, "gone (its exit status was not seen)"),
])
def test_describe_exit_tells_a_signal_from_an_exit_code(status, words):
    assert processes.describe_exit(status) == words


@pytest.fixture
def sleeper():
    """A child process that sleeps until it is killed; reaped at the end whatever happened."""
    started = []

    def start(argv=None, **popen):
        child = subprocess.Popen(argv or [sys.executable, "-c", "import time; time.sleep(60)"], **popen)
        started.append(child)
        return child

    yield start
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()


def test_a_child_killed_by_sigkill_shows_dead_with_its_signal_until_it_is_reaped(sleeper):
    child = sleeper()
    assert child.pid in processes.children(os.getpid())
    assert processes.process_state(child.pid) == ProcessState(True, None)
    assert processes.rss_bytes(child.pid) > 0 and processes.cpu_seconds(child.pid) >= 0.0
    assert processes.stub_of(child.pid) is None            # not a Python backend stub
    assert processes.stub_of(os.getpid()) is None

    child.send_signal(signal.SIGKILL)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)   # wait for its death, leaving it a zombie
    dead = processes.process_state(child.pid)
    assert dead.alive is False
    assert processes.describe_exit(dead.exit_status) == "killed by signal 9 (SIGKILL)"
    assert child.pid in processes.children(os.getpid())     # a zombie is still a child
    child.wait()
    assert processes.process_state(child.pid) == ProcessState(False, None)


def test_a_stub_process_is_known_by_its_model_file_and_instance_name(sleeper, tmp_path):
    # A stub's arguments: its own path, the model's file, ..., the instance's name the eighth.
    model_file = tmp_path / "repo" / "encoder" / "1" / "model.py"
    model_file.parent.mkdir(parents=True)
    model_file.write_text("import time\ntime.sleep(60)\n")
    argv = [f"/opt/tritonserver/backends/python/{processes.STUB_NAME}", str(model_file),
            "shm", "1048576", "1048576", "1", "/opt/tritonserver/backends/python", "0", "encoder_0_1"]
    stub = sleeper(argv, executable=sys.executable)
    plain = sleeper()
    assert processes.stub_of(stub.pid) == StubProcess(stub.pid, "encoder", "encoder_0_1")
    assert processes.live_stubs(os.getpid()) == {stub.pid: StubProcess(stub.pid, "encoder", "encoder_0_1")}
    assert plain.pid not in processes.live_stubs(os.getpid())
    stub.kill()
    os.waitid(os.P_PID, stub.pid, os.WEXITED | os.WNOWAIT)
    assert processes.live_stubs(os.getpid()) == {}          # a dead stub is not listed


# --- the endpoint -------------------------------------------------------------------------------

def view(status, reason="", restarts=0):
    return ModelView(status, reason, 1700000000.0, restarts)


SERVING_ALL = Snapshot({"a": view(SERVING), "b": view(SERVING)}, {}, 0.2, True)
TROUBLED = Snapshot({"a": view(SERVING), "b": view(RESTARTING, "died: b_0 (pid 7) killed by signal 9 (SIGKILL)", 1),
                     "c": view(DOWN, "gave up after 5 restarts in 600 s; last: died: ...", 5)},
                    {("b", "died"): 2, ("c", "died"): 5, ("c", "gave_up"): 1, ("a", "rejuvenated"): 1}, 0.2, True)


def test_metrics_list_every_model_and_reason_with_zero_before_any_restart():
    values = parse_prometheus(metrics_text(SERVING_ALL), prefixes=("latte_",))
    restarts = {k: v for k, v in values.items() if k.startswith("latte_model_restarts_total")}
    assert restarts == {f'latte_model_restarts_total{{model="{m}",reason="{r}"}}': 0.0
                        for m in "ab" for r in ("died", "hung", "rejuvenated", "gave_up")}
    assert values["latte_models_down"] == 0.0
    assert values['latte_model_ready{model="a"}'] == 1.0 and values['latte_model_given_up{model="b"}'] == 0.0
    assert values["latte_supervisor_step_age_seconds"] == pytest.approx(0.2)


def test_metrics_count_restarts_and_models_restarting_or_down():
    values = parse_prometheus(metrics_text(TROUBLED), prefixes=("latte_",))
    assert values['latte_model_restarts_total{model="b",reason="died"}'] == 2.0
    assert values['latte_model_restarts_total{model="c",reason="gave_up"}'] == 1.0
    assert values['latte_model_restarts_total{model="a",reason="rejuvenated"}'] == 1.0
    assert values['latte_model_restarts_total{model="b",reason="hung"}'] == 0.0
    assert values["latte_models_down"] == 2.0
    assert [values[f'latte_model_ready{{model="{m}"}}'] for m in "abc"] == [1.0, 0.0, 0.0]
    assert [values[f'latte_model_given_up{{model="{m}"}}'] for m in "abc"] == [0.0, 0.0, 1.0]


def test_readiness_names_each_model_not_serving_and_why():
    assert readiness(SERVING_ALL) == {"ready": True, "models": 2, "not_serving": {}}
    body = readiness(TROUBLED)
    assert body["ready"] is False and body["models"] == 3
    assert body["not_serving"] == {
        "b": {"status": RESTARTING, "reason": TROUBLED.models["b"].reason, "since": 1700000000.0},
        "c": {"status": DOWN, "reason": TROUBLED.models["c"].reason, "since": 1700000000.0},
    }
    stopped = readiness(SERVING_ALL._replace(server_alive=False))
    assert stopped["ready"] is False and stopped["server"] == "tritonserver is not running"


def test_liveness_fails_for_a_model_given_up_a_stuck_loop_or_a_stopped_server():
    assert liveness(SERVING_ALL) == {"live": True, "why": []}
    # A model restarting is not ready, but the process is live: only a model given up is not.
    restarting = SERVING_ALL._replace(models={"b": view(RESTARTING, "died: ...")})
    assert restarting.live and not restarting.ready
    assert liveness(TROUBLED) == {"live": False, "why": [f"model 'c' {TROUBLED.models['c'].reason}"]}
    stuck = SERVING_ALL._replace(last_step_age_s=20.0, server_alive=False)
    assert liveness(stuck) == {"live": False, "why": ["tritonserver is not running",
                                                      "the supervisor's last step was 20 s ago"]}


class EndpointSupervisor:
    """What the endpoint asks of a supervisor: a snapshot, and rejuvenations it records."""

    def __init__(self, models):
        self.current = SERVING_ALL
        self.models = set(models)
        self.asked = []

    def snapshot(self):
        return self.current

    def rejuvenate(self, model, why="asked for"):
        if model not in self.models:
            return False
        self.asked.append((model, why))
        return True


def call(port, path, method="GET", headers=None):
    """(status, content type, body) of one request to the endpoint."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers or {},
                                     data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


@pytest.fixture
def endpoint():
    started = []

    def serve(fake, admin_token=None):
        health = HealthEndpoint(fake, "127.0.0.1", 0, admin_token=admin_token).start()
        started.append(health)
        return health.port

    yield serve
    for health in started:
        health.stop()


def test_the_endpoint_answers_ready_live_and_metrics_from_the_supervisors_snapshot(endpoint):
    fake = EndpointSupervisor({"a", "b"})
    port = endpoint(fake)
    assert port > 0
    status, kind, body = call(port, "/ready")
    assert (status, kind, json.loads(body)) == (200, "application/json", readiness(SERVING_ALL))
    assert call(port, "/live")[0] == 200

    fake.current = TROUBLED
    status, _, body = call(port, "/ready")
    assert status == 503 and sorted(json.loads(body)["not_serving"]) == ["b", "c"]
    status, _, body = call(port, "/live/")
    assert status == 503 and json.loads(body) == liveness(TROUBLED)
    status, kind, body = call(port, "/metrics?x=1")
    assert (status, kind, body) == (200, "text/plain; version=0.0.4", metrics_text(TROUBLED))
    assert call(port, "/nothing")[0] == 404


def test_a_rejuvenation_is_asked_for_by_post_and_needs_the_admin_key_where_one_is_set(endpoint):
    fake = EndpointSupervisor({"a"})
    port = endpoint(fake, admin_token="s3cret")
    key = {ADMIN_HEADER: "s3cret"}
    status, _, body = call(port, "/models/a/rejuvenate", "POST")
    assert status == 403 and ADMIN_HEADER in json.loads(body)["error"]
    assert call(port, "/models/a/rejuvenate", "POST", {ADMIN_HEADER: "wrong"})[0] == 403
    assert fake.asked == []
    status, _, body = call(port, "/models/a/rejuvenate", "POST", key)
    assert (status, json.loads(body)) == (202, {"rejuvenating": "a"})
    assert fake.asked == [("a", "asked for through the endpoint")]
    status, _, body = call(port, "/models/zz/rejuvenate", "POST", key)
    assert status == 404 and json.loads(body)["error"] == "model 'zz' is not supervised"
    assert call(port, "/models/a/reload", "POST", key)[0] == 404
    assert len(fake.asked) == 1


def test_without_an_admin_key_anyone_may_ask_for_a_rejuvenation(endpoint):
    fake = EndpointSupervisor({"a"})
    port = endpoint(fake)
    assert call(port, "/models/a/rejuvenate/", "POST")[0] == 202
    assert fake.asked == [("a", "asked for through the endpoint")]


# --- the supervisor's loop ----------------------------------------------------------------------

class FakeClock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


class FakeServer:
    """What the supervisor asks of the tritonserver it watches."""

    http_url = "127.0.0.1:9"
    metrics_url = "http://127.0.0.1:9/metrics"

    def __init__(self):
        self.process = type("Process", (), {"pid": 4242})()
        self.alive = True

    def is_alive(self):
        return self.alive

    def admin_headers(self):
        return {ADMIN_HEADER: "key"}


class FakeRepository:
    """The repository API: the models it serves, and every reload and unload asked of it.
    Reloads answer `results` in turn (a success once none is left); while `gate` is clear a
    reload waits, as a load does while Triton loads the new copy."""

    def __init__(self, configs, results=()):
        self.configs = configs
        self.results = list(results)
        self.reloads = []
        self.unloads = []
        self.gate = threading.Event()
        self.gate.set()

    def ready_models(self):
        return sorted(self.configs)

    def config(self, model):
        return self.configs[model]

    def reload(self, model, config, generation):
        assert self.gate.wait(10.0), "the test never let the reload finish"
        self.reloads.append((model, generation, config))
        return self.results.pop(0) if self.results else LoadOutcome(True, "")

    def unload(self, model):
        self.unloads.append(model)
        return LoadOutcome(True, "")


class World:
    """The server's stub processes as /proc shows them to the supervisor, their exit statuses once
    dead, and their RSS and CPU."""

    def __init__(self):
        self.stubs = {}
        self.exits = {}
        self.rss = {}
        self.cpu = {}
        self.metrics = None

    def start(self, pid, model, instance):
        self.stubs[pid] = StubProcess(pid, model, instance)

    def end(self, pid, status=signal.SIGKILL):
        del self.stubs[pid]
        self.exits[pid] = status

    def live_stubs(self, server_pid):
        assert server_pid == 4242
        return dict(self.stubs)

    def process_state(self, pid):
        return ProcessState(True, None) if pid in self.stubs else ProcessState(False, self.exits.get(pid))


@pytest.fixture
def world(monkeypatch):
    world = World()
    monkeypatch.setattr(processes, "live_stubs", world.live_stubs)
    monkeypatch.setattr(processes, "process_state", world.process_state)
    monkeypatch.setattr(processes, "rss_bytes", lambda pid: world.rss.get(pid, 100 * MIB))
    monkeypatch.setattr(processes, "cpu_seconds", lambda pid: world.cpu.get(pid, 0.0))
    monkeypatch.setattr(supervisor_module, "read_model_metrics", lambda url: world.metrics)
    return world


@pytest.fixture
def supervise():
    """A Supervisor over a FakeServer, with the fake repository, a fake clock and its log kept.
    It adopts the repository's models and their processes as start() does; its loop, stopped
    before it begins, never runs: each test calls step() itself."""
    made = []

    def make(repository, policy=RestartPolicy(), **options):
        clock, events = FakeClock(), []
        supervisor = Supervisor(FakeServer(), policy, clock=clock, log=events.append, **options)
        supervisor.repository = repository
        supervisor._stop.set()
        supervisor.start()
        supervisor._thread.join(timeout=10.0)
        assert not supervisor._thread.is_alive()
        supervisor._stop.clear()  # its loop is gone; a stopped supervisor would vouch for nothing
        made.append(supervisor)
        return supervisor, clock, events

    yield make
    for supervisor in made:
        supervisor.stop()
        supervisor._pool.shutdown(wait=True)


def finish_work(supervisor):
    """Wait for every reload and unload handed to the worker pool; their outcomes are then queued
    for the next step. A fresh pool takes the next ones."""
    supervisor._pool.shutdown(wait=True)
    supervisor._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="latte-reload")


def test_start_adopts_every_ready_model_but_ensembles_with_its_processes_and_rules(world, supervise):
    repository = FakeRepository({"m": config_with(execute_timeout_s=5), "plain": config_with(),
                                 "pipeline": {"platform": "ensemble"}})
    world.start(101, "m", "m_0_0")
    world.start(102, "m", "m_0_1")
    world.start(103, "plain", "plain_0_0")
    world.start(999, "elsewhere", "elsewhere_0_0")
    supervisor, _, _ = supervise(repository, execute_timeout_s=30.0)
    assert sorted(supervisor.models) == ["m", "plain"]
    assert sorted(supervisor.models["m"].pids) == [101, 102]
    assert sorted(supervisor.models["plain"].pids) == [103]
    assert supervisor.models["m"].rules.execute_timeout_s == 5.0      # the model's own limit
    assert supervisor.models["plain"].rules.execute_timeout_s == 30.0  # the server's
    supervisor.step()
    snapshot = supervisor.snapshot()
    assert snapshot.ready and snapshot.live
    assert {m: v.status for m, v in snapshot.models.items()} == {"m": SERVING, "plain": SERVING}
    assert repository.reloads == []


def test_a_dead_process_restarts_its_model_as_a_new_copy(world, supervise):
    config = config_with()
    repository = FakeRepository({"m": config})
    world.start(101, "m", "m_0_0")
    world.start(102, "m", "m_0_1")
    supervisor, clock, events = supervise(repository)
    supervisor.step()

    clock.advance(1.0)
    world.end(101, signal.SIGKILL)
    supervisor.step()
    snapshot = supervisor.snapshot()
    assert snapshot.models["m"].status == RESTARTING
    assert snapshot.models["m"].reason == "died: m_0_0 (pid 101) killed by signal 9 (SIGKILL)"
    assert snapshot.models["m"].restarts_in_window == 1
    assert not snapshot.ready and snapshot.live
    assert snapshot.restarts == {("m", "died"): 1}
    assert any("restarting now (restart 1 of 5 in 600 s)" in e for e in events)
    finish_work(supervisor)
    assert repository.reloads == [("m", 1, config)]

    # The new copy serves; the replaced copy's other instance exits after the swap.
    world.start(201, "m", "m_0_0")
    world.start(202, "m", "m_0_1")
    clock.advance(1.0)
    supervisor.step()
    assert supervisor.snapshot().models["m"] == ModelView(SERVING, "", supervisor.models["m"].since, 1)
    assert sorted(supervisor.models["m"].pids) == [201, 202]
    world.end(102, 0)
    clock.advance(1.0)
    supervisor.step()
    snapshot = supervisor.snapshot()
    assert snapshot.ready and snapshot.models["m"].status == SERVING
    assert snapshot.restarts == {("m", "died"): 1}
    finish_work(supervisor)
    assert repository.reloads == [("m", 1, config)]
    assert any("serving again: died copy replaced in" in e for e in events)


def test_a_failed_reload_is_retried_after_a_growing_delay_and_the_model_given_up_after_its_restarts(world, supervise):
    repository = FakeRepository({"m": config_with()}, [LoadOutcome(False, "out of memory")] * 3)
    world.start(101, "m", "m_0_0")
    policy = RestartPolicy(max_restarts=3, window_s=600.0, backoff_base_s=2.0, max_delay_s=30.0)
    supervisor, clock, events = supervise(repository, policy)
    supervisor.step()
    world.end(101, 11)
    supervisor.step()                       # the first restart: at once
    finish_work(supervisor)
    assert [g for _, g, _ in repository.reloads] == [1]

    for delay, generation in ((2.0, 2), (4.0, 3)):
        supervisor.step()                   # the failure comes back: the next restart waits
        record = supervisor.snapshot().models["m"]
        assert record.status == RESTARTING
        assert record.reason == "died: the new copy failed to load: out of memory"
        clock.advance(delay - 0.5)
        supervisor.step()
        finish_work(supervisor)
        assert len(repository.reloads) == generation - 1    # not yet
        clock.advance(0.5)
        supervisor.step()
        finish_work(supervisor)
        assert [g for _, g, _ in repository.reloads] == list(range(1, generation + 1))

    supervisor.step()                       # the third failure: no restart is left
    finish_work(supervisor)
    snapshot = supervisor.snapshot()
    assert snapshot.models["m"].status == DOWN
    assert snapshot.models["m"].reason.startswith("gave up after 3 restarts in 600 s; last: died: the new copy "
                                                  "failed to load: out of memory")
    assert snapshot.restarts == {("m", "died"): 3, ("m", "gave_up"): 1}
    assert not snapshot.live and not snapshot.ready
    assert repository.unloads == ["m"]
    assert any("it stays down until loaded again (POST /v2/repository/models/m/load)" in e for e in events)

    # Down, it is left alone: processes coming and going start nothing.
    world.start(301, "m", "m_0_0")
    clock.advance(100.0)
    supervisor.step()
    world.end(301)
    clock.advance(100.0)
    supervisor.step()
    finish_work(supervisor)
    assert len(repository.reloads) == 3 and repository.unloads == ["m"]
    assert supervisor.snapshot().models["m"].status == DOWN


@pytest.mark.parametrize("exits", ["after the outcome is taken", "with the outcome", "while the reload runs"])
def test_the_replaced_copys_processes_exiting_is_no_death(world, supervise, exits):
    repository = FakeRepository({"m": config_with()})
    world.start(101, "m", "m_0_0")
    supervisor, clock, events = supervise(repository)
    supervisor.step()
    assert supervisor.rejuvenate("m") is True
    repository.gate.clear()
    clock.advance(1.0)
    supervisor.step()
    assert supervisor.models["m"].reloading == "rejuvenated"

    world.start(201, "m", "m_0_0")          # the new copy loads beside the serving one
    if exits == "while the reload runs":
        world.end(101, 0)
        clock.advance(1.0)
        supervisor.step()
    repository.gate.set()
    finish_work(supervisor)
    if exits == "with the outcome":
        world.end(101, 0)
    clock.advance(1.0)
    supervisor.step()
    if exits == "after the outcome is taken":
        world.end(101, 0)
    clock.advance(1.0)
    supervisor.step()
    finish_work(supervisor)

    snapshot = supervisor.snapshot()
    assert snapshot.models["m"].status == SERVING and snapshot.ready
    assert snapshot.restarts == {("m", "rejuvenated"): 1}
    assert [g for _, g, _ in repository.reloads] == [1]
    assert sorted(supervisor.models["m"].pids) == [201]
    # The new copy is watched: its death is one.
    world.end(201)
    clock.advance(1.0)
    supervisor.step()
    assert supervisor.snapshot().models["m"].status == RESTARTING


def test_a_rejuvenation_asked_for_reloads_without_spending_a_restart(world, supervise):
    repository = FakeRepository({"m": config_with()})
    world.start(101, "m", "m_0_0")
    supervisor, clock, events = supervise(repository)
    assert supervisor.rejuvenate("unknown") is False
    assert supervisor.rejuvenate("m", "asked for through the endpoint") is True
    supervisor.step()
    finish_work(supervisor)
    assert [(m, g) for m, g, _ in repository.reloads] == [("m", 1)]
    assert any("rejuvenating: asked for through the endpoint; a new copy loads while this one serves" in e
               for e in events)
    assert supervisor.snapshot().models["m"].status == SERVING   # the serving copy serves on
    assert supervisor.snapshot().restarts == {}
    world.start(201, "m", "m_0_0")
    clock.advance(1.0)
    supervisor.step()
    snapshot = supervisor.snapshot()
    assert snapshot.restarts == {("m", "rejuvenated"): 1}
    assert snapshot.models["m"].restarts_in_window == 0
    assert any("rejuvenated in" in e for e in events)


def test_a_failed_rejuvenation_leaves_the_serving_copy_watched(world, supervise):
    repository = FakeRepository({"m": config_with()}, [LoadOutcome(False, "no room for a second copy")])
    world.start(101, "m", "m_0_0")
    supervisor, clock, events = supervise(repository)
    supervisor.rejuvenate("m")
    supervisor.step()
    finish_work(supervisor)
    clock.advance(1.0)
    supervisor.step()
    assert any("rejuvenation failed, the serving copy stays: no room for a second copy" in e for e in events)
    snapshot = supervisor.snapshot()
    assert snapshot.models["m"].status == SERVING and snapshot.restarts == {}

    world.end(101, signal.SIGSEGV)
    clock.advance(1.0)
    supervisor.step()
    record = supervisor.snapshot().models["m"]
    assert record.status == RESTARTING
    assert record.reason == "died: m_0_0 (pid 101) killed by signal 11 (SIGSEGV)"


def test_a_rule_tripped_rejuvenates_the_model_no_more_often_than_its_interval(world, supervise):
    config = config_with(health_rss_growth_mib_per_min=10, health_rss_window_s=60, rejuvenate_min_interval_s=600)
    repository = FakeRepository({"m": config})
    world.start(101, "m", "m_0_0")
    supervisor, clock, events = supervise(repository)
    for mib in (100, 130):                  # 60 MiB/min, but not yet over the rule's window
        world.rss[101] = mib * MIB
        supervisor.step()
        clock.advance(30.0)
    finish_work(supervisor)
    assert repository.reloads == []
    world.rss[101] = 160 * MIB
    supervisor.step()
    finish_work(supervisor)
    assert [g for _, g, _ in repository.reloads] == [1]
    assert any("rejuvenating: RSS grew 60.0 MiB/min over 60 s (rule: at most 10 MiB/min)" in e for e in events)

    # The new copy leaks as fast; it is judged afresh, and not rejuvenated again within 600 s.
    world.end(101, 0)
    world.start(201, "m", "m_0_0")
    for mib in range(100, 400, 30):
        world.rss[201] = mib * MIB
        clock.advance(30.0)
        supervisor.step()
    finish_work(supervisor)
    assert [g for _, g, _ in repository.reloads] == [1]
    snapshot = supervisor.snapshot()
    assert snapshot.restarts == {("m", "rejuvenated"): 1} and snapshot.models["m"].restarts_in_window == 0


def begin_batch(recorder, digests, ago_s, monkeypatch):
    """Mark a batch in a flight file as begun `ago_s` seconds ago."""
    started = time.monotonic_ns() - int(ago_s * 1e9)
    with monkeypatch.context() as patch:
        patch.setattr(time, "monotonic_ns", lambda: started)
        return recorder.begin(digests)


@pytest.fixture
def recorders():
    opened = []

    def open_recorder(state_dir, model, instance, pid):
        recorder = FlightRecorder(state.flight_path(state_dir, model, instance, pid), pid=pid)
        opened.append(recorder)
        return recorder

    yield open_recorder
    for recorder in opened:
        recorder.close()


def test_a_batch_past_its_limit_kills_its_instance_and_that_death_counts_as_hung(world, supervise, recorders,
                                                                                 tmp_path, monkeypatch):
    killed = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append((pid, sig)))
    repository = FakeRepository({"m": config_with(execute_timeout_s=5)})
    world.start(101, "m", "m_0_0")
    world.start(102, "m", "m_0_1")
    supervisor, clock, events = supervise(repository, state_dir=tmp_path)
    stuck = recorders(tmp_path, "m", "m_0_0", 101)
    begin_batch(stuck, [digest(1), digest(2)], 120.0, monkeypatch)
    busy = recorders(tmp_path, "m", "m_0_1", 102)
    busy.begin([digest(3)])                 # running, within its limit
    supervisor.step()
    assert killed == [(101, signal.SIGKILL)]
    clock.advance(0.2)
    supervisor.step()                       # not dead yet: it is not killed twice
    assert killed == [(101, signal.SIGKILL)]
    assert supervisor.snapshot().models["m"].status == SERVING

    world.end(101, signal.SIGKILL)
    clock.advance(0.2)
    supervisor.step()
    snapshot = supervisor.snapshot()
    assert snapshot.models["m"].status == RESTARTING
    assert re.fullmatch(r"hung: an execute ran 12\d\.\d s, past its limit of 5 s; "
                        r"m_0_0 \(pid 101\) killed by signal 9 \(SIGKILL\)", snapshot.models["m"].reason)
    assert snapshot.restarts == {("m", "hung"): 1}
    assert not state.flight_path(tmp_path, "m", "m_0_0", 101).exists()
    assert PoisonList(state.poison_path(tmp_path, "m")).crashes == {digest(1).hex(): 1, digest(2).hex(): 1}
    finish_work(supervisor)
    assert [g for _, g, _ in repository.reloads] == [1]


@pytest.mark.parametrize("status, blamed", [
    (signal.SIGSEGV, True), (signal.SIGBUS, True), (signal.SIGABRT, True), (signal.SIGFPE, True),
    (3 << 8, True),                                  # os._exit(3) in the model's code
    (signal.SIGKILL, False), (signal.SIGTERM, False),  # the OOM killer, an operator, a stop
    (0, False), (None, False)])
def test_only_a_crash_of_the_process_own_making_blames_its_inputs(status, blamed):
    assert processes.blames_input(status) is blamed


def test_a_process_killed_from_outside_blames_no_input(world, supervise, recorders, tmp_path):
    """The OOM killer's SIGKILL says nothing of the inputs in flight: none is counted, and the
    flight file still goes."""
    repository = FakeRepository({"m": config_with()})
    world.start(101, "m", "m_0_0")
    supervisor, _, events = supervise(repository, state_dir=tmp_path)
    recorders(tmp_path, "m", "m_0_0", 101).begin([digest(1)])
    supervisor.step()
    world.end(101, signal.SIGKILL)
    supervisor.step()
    assert PoisonList(state.poison_path(tmp_path, "m")).crashes == {}
    assert not state.flight_path(tmp_path, "m", "m_0_0", 101).exists()
    assert supervisor.snapshot().models["m"].status == RESTARTING
    finish_work(supervisor)


def test_the_inputs_in_flight_at_each_death_are_counted_and_refused_at_the_second(world, supervise, recorders,
                                                                                  tmp_path):
    repository = FakeRepository({"m": config_with()})
    world.start(101, "m", "m_0_0")
    supervisor, clock, events = supervise(repository, state_dir=tmp_path)
    recorders(tmp_path, "m", "m_0_0", 101).begin([digest(1), digest(1)])
    supervisor.step()
    world.end(101, signal.SIGSEGV)
    supervisor.step()
    poison = PoisonList(state.poison_path(tmp_path, "m"))
    assert poison.crashes == {digest(1).hex(): 1} and poison.refused() == set()
    assert not state.flight_path(tmp_path, "m", "m_0_0", 101).exists()
    finish_work(supervisor)

    world.start(201, "m", "m_0_0")
    clock.advance(1.0)
    supervisor.step()                       # serving again
    recorders(tmp_path, "m", "m_0_0", 201).begin([digest(1), digest(2)])
    world.end(201, signal.SIGSEGV)
    clock.advance(1.0)
    supervisor.step()
    poison = PoisonList(state.poison_path(tmp_path, "m"))
    assert poison.crashes == {digest(1).hex(): REFUSE_AFTER, digest(2).hex(): 1}
    assert poison.refused() == set()  # never alone in its batch: maybe only batched with the culprit
    clock.advance(2.0)
    supervisor.step()                       # the second restart, a second after the second death
    world.start(301, "m", "m_0_0")
    finish_work(supervisor)
    clock.advance(1.0)
    supervisor.step()                       # serving again
    assert supervisor.snapshot().models["m"].status == SERVING
    recorders(tmp_path, "m", "m_0_0", 301).begin([digest(1)])   # alone in its batch, as a suspect runs
    world.end(301, signal.SIGSEGV)
    clock.advance(1.0)
    supervisor.step()
    poison = PoisonList(state.poison_path(tmp_path, "m"))
    assert poison.refused() == {digest(1)}
    assert any(f"1 input(s) were in flight at {REFUSE_AFTER} of its crashes, alone in a batch at one; "
               "they are refused from now on" in e for e in events)
    # The third death within the window waits two seconds before its restart, counted when it is made.
    assert supervisor.snapshot().models["m"].status == RESTARTING
    assert supervisor.snapshot().restarts == {("m", "died"): 2}
    clock.advance(1.0)
    supervisor.step()
    assert supervisor.snapshot().restarts == {("m", "died"): 2}
    clock.advance(1.0)
    supervisor.step()
    assert supervisor.snapshot().restarts == {("m", "died"): 3}


def test_a_stopped_supervisor_vouches_for_nothing(world, supervise):
    repository = FakeRepository({"m": config_with()})
    world.start(101, "m", "m_0_0")
    supervisor, _, _ = supervise(repository)
    supervisor.step()
    assert supervisor.snapshot().ready
    supervisor.stop()  # as latte serve does before starting tritonserver again
    assert not supervisor.snapshot().ready and not supervisor.snapshot().live


def test_a_stopped_server_has_no_processes_to_read_and_the_snapshot_says_so(world, supervise):
    repository = FakeRepository({"m": config_with()})
    supervisor, clock, _ = supervise(repository)
    supervisor.server.alive = False
    clock.advance(3.0)
    supervisor.step()
    snapshot = supervisor.snapshot()
    assert not snapshot.server_alive and not snapshot.ready and not snapshot.live
    assert snapshot.last_step_age_s == 0.0
    clock.advance(20.0)
    assert supervisor.snapshot().last_step_age_s == 20.0
