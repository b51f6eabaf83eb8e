"""Overload: a step to several times capacity with two priority classes and abandoned sessions.

The model is served from a variant config with two priority levels and a bounded queue
whose timeout rejects what cannot be served in time, so overload is shed, not queued
without end. Level 1 is the high-priority class (Triton serves lower numbers first).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from latte.bench.arena import arena_figures
from latte.bench.inputs import fetch_model_inputs
from latte.bench.lengths import LengthDistribution
from latte.bench.loadgen import (AsyncSender, Outcomes, error_kind, grpc_inputs, percentile, poisson_schedule,
                                run_open_loop)
from latte.bench.prometheus_scrape import MetricsSampler
from latte.bench.target import Target
from latte.generator.validate import STALL_FREE_INSTANCES

HIGH, LOW = 1, 2


@dataclass
class OverloadSettings:
    model: str
    capacity_s: float = 3.0          # closed-loop measurement of what the server sustains
    baseline_s: float = 4.0          # offered load below capacity before the step
    step_s: float = 8.0              # the overload step
    recovery_s: float = 6.0          # below capacity again after the step
    below: float = 0.5               # baseline/recovery load as a fraction of capacity
    overload: float = 3.0            # step load as a multiple of capacity
    high_share: float = 0.2          # fraction of requests sent at high priority
    high_slo_ms: float = 500.0       # the high-priority class's P99 objective during the step
    abandoned_sessions: int = 16
    rows: int = 8                    # rows per request: heavier requests keep the client's own load small
    session_ttl_s: float = 3.0       # the variant config's idle TTL for sessions
    in_flight_limit: int = 512
    lengths: LengthDistribution = field(default_factory=lambda: LengthDistribution.parse("fixed:length=64"))
    seed: int = 0

    def validate(self) -> None:
        if self.overload <= 1:
            raise ValueError(f"an overload step must exceed capacity (multiple > 1), got {self.overload}")
        if not 0 < self.high_share < 1:
            raise ValueError(f"the high-priority share must be in (0, 1), got {self.high_share}")
        if min(self.capacity_s, self.baseline_s, self.step_s, self.recovery_s) <= 0:
            raise ValueError("every phase of the overload run needs a duration > 0 s")


def overload_variant_context(context: dict, queue_timeout_us: int, max_queue_size: int,
                             session_ttl_s: float = 3.0, instances: int = STALL_FREE_INSTANCES) -> dict:
    """A model context (as rendered by the generator) with two priority levels and a shedding queue,
    on `instances` instances: one instance behind them stalls up to 500 ms in Triton 2.51
    (docs/backend.md, Priorities), two make that rare.

    A model with a ragged input also keeps sessions on it, with a short idle TTL, so that the
    sessions abandoned during the step are seen to be reclaimed.
    """
    variant = dict(context)
    ragged = [t["name"] for t in context["inputs"] if t.get("allow_ragged_batch")]
    if ragged:
        variant["parameters"] = {**context.get("parameters", {}), "session_input": ragged[0],
                                 "session_ttl_s": f"{session_ttl_s:g}"}
    variant["instance_groups"] = [{**group, "count": instances}
                                  for group in context.get("instance_groups") or [{"kind": "KIND_CPU"}]]
    variant["dynamic_batching"] = {
        **(context.get("dynamic_batching") or {}),
        "priority_levels": 2,
        "default_priority_level": LOW,
        "default_queue_policy": {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": queue_timeout_us,
            "max_queue_size": max_queue_size,
        },
    }
    return variant


def _example_model(example_repo: Path, model: str):
    """(the example's model context, its model file) for `model` of an example repository."""
    from latte.examples import EXAMPLES, FORMATS, model_context

    manifest = json.loads((Path(example_repo) / "examples.json").read_text())
    if model not in manifest:
        raise ValueError(f"{model!r} is not an example model of {example_repo}; expected one of {sorted(manifest)}")
    info = manifest[model]
    model_file = Path(example_repo) / model / "1" / FORMATS[info["runtime"]]
    return model_context(EXAMPLES[info["example"]], info["runtime"], model_file.name), model_file


# Instances of the overload variant. One, knowingly behind Triton 2.51's stall: on the 2-core
# box a second instance of the sequence model under a 3x step raised the high class's P50 from
# 15-30 ms to 237 ms (P99 697 ms) and overflowed the client's 512 requests in flight, since both
# stubs then share the cores with the server and the client; the stall costs less.
OVERLOAD_INSTANCES = 1


def write_overload_repository(example_repo: Path, model: str, out: Path, queue_timeout_us: int = 100_000,
                              max_queue_size: int = 64, session_ttl_s: float = 3.0,
                              instances: int = OVERLOAD_INSTANCES) -> Path:
    """A repository holding only `model` from an example repository, rendered with the overload variant."""
    from latte.generator.model_folder import write_model

    context, model_file = _example_model(example_repo, model)
    context = overload_variant_context(context, queue_timeout_us, max_queue_size, session_ttl_s, instances)
    if out.exists():
        shutil.rmtree(out)
    model_dir = write_model(out, context, {model_file.name: model_file})
    config = model_dir / "config.pbtxt"
    config.write_text(with_high_priority_policy(config.read_text(), f"{model}/config.pbtxt", allow_stall=True))
    return out


# The high-priority level is never shed by its queue's timeout: a short default timeout cannot be
# lengthened per request (Triton lets requests only shorten it), so level 1 gets its own policy.
HIGH_PRIORITY_POLICY = f"""
  priority_queue_policy {{
    key: {HIGH}
    value {{
      timeout_action: DELAY
      default_timeout_microseconds: 0
      max_queue_size: 0
    }}
  }}"""


def with_high_priority_policy(config_text: str, where: str, allow_stall: bool = False) -> str:
    """config.pbtxt text with HIGH_PRIORITY_POLICY added to its dynamic_batching block, checked by
    Triton's schema; a config that stalls one instance is refused unless `allow_stall`."""
    from latte.generator.validate import batcher_stall, parse_config

    marker = "dynamic_batching {"
    if marker not in config_text:
        raise ValueError(f"{where} has no dynamic_batching block to add a priority queue policy to")
    text = config_text.replace(marker, marker + HIGH_PRIORITY_POLICY, 1)
    stall = batcher_stall(parse_config(text, where))
    if stall and not allow_stall:
        raise ValueError(f"{where}: {stall}")
    return text


def _class_report(outcomes: Outcomes, slo_ms: Optional[float] = None) -> dict:
    with outcomes.lock:
        latencies = list(outcomes.latencies_ms)
        report = {"sent": outcomes.sent, "succeeded": outcomes.succeeded, "failed": outcomes.failed,
                  "errors": dict(outcomes.errors)}
    report["answered"] = report["succeeded"] + report["failed"]
    report["shed_rate"] = round(report["failed"] / report["sent"], 4) if report["sent"] else 0.0
    report["p50_ms"] = round(percentile(latencies, 50), 2)
    report["p99_ms"] = round(percentile(latencies, 99), 2)
    if slo_ms is not None:
        report["slo_ms"] = slo_ms
        report["slo_held"] = bool(latencies) and report["p99_ms"] <= slo_ms
    return report


def _abandon_sessions(grpc_url: str, model: str, feed: Dict[str, np.ndarray], count: int, first_id: int) -> int:
    """Clients that open a session, get its first answer, and vanish without ever ending it."""
    import tritonclient.grpc as grpcclient

    opened = 0
    for i in range(count):
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            client.infer(model, grpc_inputs(feed), priority=HIGH, client_timeout=30,
                         parameters={"session_id": f"abandoned-{first_id + i}", "session_start": True})
            opened += 1
        except Exception:  # a refused session is counted as not opened; the run goes on
            pass
        finally:
            client.close()
    return opened


def _memory(sampler: MetricsSampler, model: str) -> dict:
    sample = sampler.sample_now()
    return {"server_rss_mb": round(sample.server_rss / 2**20, 2), "stubs_rss_mb": round(sample.stubs_rss / 2**20, 2),
            **arena_figures(sample.metrics, model)}


def run_overload(target: Target, settings: OverloadSettings,
                 progress: Optional[Callable[[str], None]] = None) -> dict:
    settings.validate()
    say = progress or (lambda message: None)
    rng = np.random.default_rng(settings.seed)
    model_inputs = fetch_model_inputs(target.http_url, settings.model)
    lengths = settings.lengths.sample(rng, 128, model_inputs.max_length) if model_inputs.variable else [1] * 128
    feeds = [model_inputs.request(rng, int(n), rows=settings.rows) for n in lengths]
    sampler = MetricsSampler(target.metrics_url, target.server_pid, interval=3600)

    say("measuring capacity (closed loop)")
    probe = AsyncSender(target.grpc_url, settings.model, limit=16)
    probe_outcomes = Outcomes()
    started = time.perf_counter()
    sent = 0
    while time.perf_counter() - started < settings.capacity_s:
        probe.send(feeds[sent % len(feeds)], probe_outcomes, priority=HIGH)
        sent += 1
    probe.drain(60)
    capacity = probe_outcomes.succeeded / (time.perf_counter() - started)
    probe.close()
    if capacity <= 0:
        raise RuntimeError(f"no request to {settings.model!r} succeeded while measuring capacity: "
                           f"{dict(probe_outcomes.errors)}")

    sender = AsyncSender(target.grpc_url, settings.model, settings.in_flight_limit)
    phases: Dict[str, Dict[int, Outcomes]] = {}
    memory = {}
    lags = {}

    def phase(name: str, rate: float, duration: float) -> None:
        per_class = phases[name] = {HIGH: Outcomes(), LOW: Outcomes()}
        times = poisson_schedule(rate, duration, rng)
        priorities = np.where(rng.random(len(times)) < settings.high_share, HIGH, LOW)

        def send(i: int) -> None:
            p = int(priorities[i])
            # Never blocks the schedule: a request the client has no slot for is shed by the client.
            if not sender.send(feeds[i % len(feeds)], per_class[p], priority=p, block=False):
                per_class[p].count_sent()
                per_class[p].record(0.0, "client in-flight limit reached")
        say(f"{name}: {rate:.0f} req/s for {duration:g} s")
        lags[name] = round(run_open_loop(times, send), 3)

    memory["before"] = _memory(sampler, settings.model)
    phase("baseline", settings.below * capacity, settings.baseline_s)
    drained = sender.drain(60)
    memory["baseline"] = _memory(sampler, settings.model)
    say(f"abandoning {settings.abandoned_sessions} sessions")
    one_row = model_inputs.request(rng, int(lengths[0]), rows=1)
    abandoned = _abandon_sessions(target.grpc_url, settings.model, one_row, settings.abandoned_sessions, 1_000_000)
    # The backend publishes its series about once a second: wait for the opened sessions to show.
    deadline = time.monotonic() + 5.0
    memory["sessions_opened"] = _memory(sampler, settings.model)
    while memory["sessions_opened"]["live_sessions"] < abandoned and time.monotonic() < deadline:
        time.sleep(0.25)
        memory["sessions_opened"] = _memory(sampler, settings.model)
    phase("step", settings.overload * capacity, settings.step_s)
    memory["peak"] = _memory(sampler, settings.model)
    drained = sender.drain(120) and drained
    phase("recovery", settings.below * capacity, settings.recovery_s)
    drained = sender.drain(120) and drained
    sender.close()
    time.sleep(1.0)  # lets the server release what the last batches held before memory is read
    memory["after"] = _memory(sampler, settings.model)
    if memory["after"]["live_sessions"]:
        # Idle sessions are reclaimed when the backend next runs; one light request lets it.
        time.sleep(settings.session_ttl_s)
        tail = AsyncSender(target.grpc_url, settings.model, limit=1)
        tail.send(feeds[0], Outcomes(), priority=HIGH)
        tail.drain(30)
        tail.close()
        memory["after"] = _memory(sampler, settings.model)

    sent_total = sum(o.sent for per_class in phases.values() for o in per_class.values())
    answered_total = sum(o.answered for per_class in phases.values() for o in per_class.values())
    base = memory["baseline"]
    after = memory["after"]
    return {
        "model": settings.model,
        "capacity_rps": round(capacity, 1),
        "phases": {"baseline": [settings.below, settings.baseline_s], "step": [settings.overload, settings.step_s],
                   "recovery": [settings.below, settings.recovery_s]},
        "sender_lag_s": lags,
        "per_phase": {name: {"high": _class_report(per_class[HIGH], settings.high_slo_ms if name == "step" else None),
                              "low": _class_report(per_class[LOW])} for name, per_class in phases.items()},
        "whole_run": {"sent": sent_total, "answered": answered_total, "drained": drained,
                      "every_request_answered_once": drained and sent_total == answered_total},
        "abandoned_sessions": abandoned,
        "live_sessions_after": memory["after"]["live_sessions"],
        "sessions_peak": memory["sessions_opened"]["live_sessions"],
        "server_alive_after": _server_ready(target.http_url),
        "memory": memory,
        "memory_return": {
            "server_rss_after_vs_baseline": round(after["server_rss_mb"] / base["server_rss_mb"] - 1, 4)
            if base["server_rss_mb"] else None,
            "stubs_rss_after_vs_baseline": round(after["stubs_rss_mb"] / base["stubs_rss_mb"] - 1, 4)
            if base["stubs_rss_mb"] else None,
        },
    }


def _server_ready(http_url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


# -- whose queue: Triton's priority queue against latte's own (async_execute: true) ---------------

TRITON_QUEUE, LATTE_QUEUE, IDLE = "triton_queue", "latte_queue", "idle"


@dataclass
class QueueFloodSettings:
    """A closed-loop flood of default-priority requests and a probe, in a process of its own,
    that sends one high-priority request at a time, against each queue in turn. The default
    class's figures are the flood's own requests (all of default priority)."""
    model: str                       # the example model both variants serve
    concurrency: int = 512           # default-priority requests the flood keeps in flight
    duration_s: float = 20.0         # the most probe time per variant
    probe_requests: int = 10_000     # the probe stops after this many high-priority answers
    max_queue_size: int = 64         # both queues' bound (Triton's default_queue_policy, latte's parameter)
    queue_timeout_us: int = 100_000  # Triton's default-priority queue timeout (the overload variant's)
    lengths: LengthDistribution = field(default_factory=lambda: LengthDistribution.parse("fixed:length=64"))
    seed: int = 0

    def validate(self) -> None:
        if self.concurrency < 1 or self.probe_requests < 1 or self.max_queue_size < 1:
            raise ValueError("the flood's concurrency, the probe's requests and the queue size must each be >= 1")
        if self.duration_s <= 0:
            raise ValueError(f"the probe needs a duration > 0 s, got {self.duration_s}")


def latte_queue_context(context: dict, max_queue_size: int) -> dict:
    """The model with latte holding the queue: execute hands requests to the scheduler lanes and
    returns (async_execute: true), bounded by max_queue_size; no Triton priority levels, so one
    instance does not stall (docs/backend.md, Priorities)."""
    variant = dict(context)
    variant["parameters"] = {**context.get("parameters", {}), "async_execute": "true",
                             "max_queue_size": str(max_queue_size)}
    variant["dynamic_batching"] = {"max_queue_delay_microseconds": 0}
    return variant


def write_queue_flood_repository(example_repo: Path, model: str, out: Path, max_queue_size: int = 64,
                                 queue_timeout_us: int = 100_000) -> Dict[str, str]:
    """`model` three times: behind Triton's priority queue (the overload variant, two instances),
    behind latte's (latte_queue_context), and as the example serves it, left idle: the probe's
    twin measures what the machine itself adds under the flood. Returns {variant: served model name}."""
    from latte.generator.model_folder import write_model

    context, model_file = _example_model(example_repo, model)
    names = {TRITON_QUEUE: f"{model}_{TRITON_QUEUE}", LATTE_QUEUE: f"{model}_{LATTE_QUEUE}", IDLE: f"{model}_{IDLE}"}
    if out.exists():
        shutil.rmtree(out)
    triton = {**overload_variant_context(context, queue_timeout_us, max_queue_size), "name": names[TRITON_QUEUE]}
    config = write_model(out, triton, {model_file.name: model_file}) / "config.pbtxt"
    config.write_text(with_high_priority_policy(config.read_text(), f"{names[TRITON_QUEUE]}/config.pbtxt"))
    write_model(out, {**latte_queue_context(context, max_queue_size), "name": names[LATTE_QUEUE]},
                {model_file.name: model_file})
    write_model(out, {**context, "name": names[IDLE]}, {model_file.name: model_file})
    return names


def _probe_report(latencies: List[float], failures: Dict[str, int]) -> dict:
    return {"answered": len(latencies), "failed": sum(failures.values()), "errors": dict(failures),
            "p50_ms": round(percentile(latencies, 50), 2), "p99_ms": round(percentile(latencies, 99), 2),
            "max_ms": round(max(latencies), 2) if latencies else float("nan"),
            "over_100_ms": sum(1 for ms in latencies if ms > 100.0)}


def _probe(grpc_url: str, served_model: str, feeds: List[Dict[str, np.ndarray]], high: dict, duration_s: float,
           count: int, results) -> None:
    """The high-priority probe, run in a process of its own: in the flood's process its timings
    would include waits for the interpreter lock behind the flood's own callbacks."""
    import tritonclient.grpc as grpcclient

    probe = grpcclient.InferenceServerClient(grpc_url)
    latencies, failures = [], Counter()
    started = time.perf_counter()
    sent = 0
    try:
        while sent < count and time.perf_counter() - started < duration_s:
            begun = time.perf_counter()
            try:
                probe.infer(served_model, grpc_inputs(feeds[sent % len(feeds)]), client_timeout=60, **high)
                latencies.append((time.perf_counter() - begun) * 1000)
            except Exception as exc:  # counted under its cause; the probe goes on
                failures[error_kind(str(exc))] += 1
            sent += 1
    finally:
        probe.close()
        results.put((latencies, dict(failures)))


def run_queue_flood(target: Target, served_model: str, variant: str, settings: QueueFloodSettings,
                    idle_model: Optional[str] = None, progress: Optional[Callable[[str], None]] = None) -> dict:
    """Flood `served_model` with default-priority requests while the probe measures high
    priority: Triton's `priority` for Triton's queue, latte's `priority_level` for latte's.

    With `idle_model` (an unflooded copy of the model), a second probe sends it the same requests
    at the same time: what one request costs on this machine under this flood, whatever the queue.
    """
    import multiprocessing

    settings.validate()
    say = progress or (lambda message: None)
    rng = np.random.default_rng(settings.seed)
    model_inputs = fetch_model_inputs(target.http_url, served_model)
    lengths = settings.lengths.sample(rng, 128, model_inputs.max_length) if model_inputs.variable else [1] * 128
    feeds = [model_inputs.request(rng, int(n), rows=1) for n in lengths]
    # As a client would send it to each: Triton's `priority` (plus latte's level, which orders the
    # requests of one execute call) for Triton's queue; latte's `priority_level` for latte's.
    high = {"parameters": {"priority_level": 1}}
    if variant == TRITON_QUEUE:
        high["priority"] = HIGH

    flood = AsyncSender(target.grpc_url, served_model, settings.concurrency)
    flood_outcomes = Outcomes()
    stop = threading.Event()

    def keep_flooding() -> None:
        sent = 0
        while not stop.is_set():
            flood.send(feeds[sent % len(feeds)], flood_outcomes)  # blocks while all slots are in flight
            sent += 1

    flooder = threading.Thread(target=keep_flooding, name="flood", daemon=True)
    flooder.start()
    say(f"{variant}: flood of {settings.concurrency} default-priority requests; probing until "
        f"{settings.probe_requests} high-priority answers or {settings.duration_s:g} s")
    spawn = multiprocessing.get_context("spawn")
    probes = {"high": (served_model, high)}
    if idle_model is not None:
        probes[IDLE] = (idle_model, {})
    queues = {name: spawn.Queue() for name in probes}
    processes = {name: spawn.Process(target=_probe, name=f"probe-{name}", daemon=True,
                                     args=(target.grpc_url, model, feeds, options, settings.duration_s,
                                           settings.probe_requests, queues[name]))
                 for name, (model, options) in probes.items()}
    measured = {}
    try:
        for process in processes.values():
            process.start()
        for name, process in processes.items():
            measured[name] = queues[name].get(timeout=settings.duration_s + 120)
            process.join(30)
    finally:
        stop.set()
        for process in processes.values():
            if process.is_alive():
                process.kill()
    flooder.join(60)
    drained = flood.drain(120)
    flood.close()
    flood_report = _class_report(flood_outcomes)
    report = {"variant": variant, "model": served_model,
              **{name: _probe_report(*measured[name]) for name in probes},
              "flood": flood_report,
              "every_flood_request_answered_once": drained and flood_report["answered"] == flood_report["sent"]}
    h, d = report["high"]["p99_ms"], flood_report["p99_ms"]
    report["high_vs_default_p99"] = round(h / d, 3) if d and d == d and h == h else None
    return report
