"""Figures of streaming runs: tokens/s, time to first token, inter-token latency, streams in
flight; and the in-process batched loop, the bound a served streaming model is measured
against (with the cost of the responses alone, the echo), by itself and beside the echo's
traffic."""

from __future__ import annotations

import dataclasses
import json
import select
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from latte.bench.cpu import box_busy_seconds
from latte.triton.streams import StreamRecord

# CPU seconds so far of a process or a group of them, by name (measure_streams' `cpu`).
CpuReader = Callable[[], Dict[str, float]]


@dataclass
class StreamFigures:
    tokens_per_s: float
    ttft_p50_ms: Optional[float]
    ttft_p99_ms: Optional[float]
    itl_p50_ms: Optional[float]
    itl_p99_ms: Optional[float]
    started: int            # streams that began in the window
    in_flight: float        # streams open at once, on average over the window
    errors: int
    # Each stream's time to first token in the window (ms, 3 significant digits, sorted), for
    # percentiles over several windows together: a window of a few seconds holds a few hundred
    # first tokens (the stock model's, at 16 streams, about 140), so its own P99 is one of its
    # two largest.
    ttft_ms: Tuple[float, ...] = field(default=(), repr=False)
    # The machine's cores busy over the window, on average (every process: server, stubs,
    # clients); None where it was not read. And the cores of the processes a caller named.
    busy_cores: Optional[float] = None
    process_cores: Optional[Dict[str, float]] = None

    def as_dict(self, samples: bool = False) -> Dict:
        """The figures; with `samples`, the first-token times too."""
        figures = dict(self.__dict__)
        if not samples:
            del figures["ttft_ms"]
        return figures


def pooled_ms(windows: Sequence[Dict], q: float) -> Optional[float]:
    """The q-th percentile of the first-token times of `windows` (as_dict(samples=True)) taken
    together."""
    values = [t for window in windows for t in window["ttft_ms"]]
    return float(np.percentile(values, q)) if values else None


def _ms(values: Sequence[float], q: float) -> Optional[float]:
    return float(np.percentile(values, q) * 1000) if len(values) else None


def stream_figures(records: Sequence[StreamRecord], start: float, end: float) -> StreamFigures:
    """What the records show between `start` and `end` (perf_counter seconds): tokens that
    arrived in the window per second; TTFT and inter-token gaps of streams sent in it."""
    window = max(end - start, 1e-9)
    tokens = sum(1 for r in records for t in r.arrivals if start <= t <= end)
    inside = [r for r in records if start <= r.sent <= end]
    ttft = [r.ttft for r in inside if r.ttft is not None]
    gaps = [g for r in inside for g in r.inter_token()]
    open_s = sum(max(0.0, min(end, r.arrivals[-1] if r.arrivals else r.sent) - max(start, r.sent)) for r in records)
    return StreamFigures(tokens / window, _ms(ttft, 50), _ms(ttft, 99), _ms(gaps, 50), _ms(gaps, 99), len(inside),
                         open_s / window, sum(1 for r in records if r.error),
                         tuple(float(f"{t * 1000:.3g}") for t in sorted(ttft)))


def in_process_model(folder: Path):
    """The latte streaming model at `folder` loaded in this process (the stub stood in for),
    its loop stopped: the caller drives `model.runner.run_once()`."""
    from google.protobuf import json_format

    from latte.backend.standin_stub import StandinStub
    from latte.backend.streaming.model import StreamingModel
    from latte.generator.validate import parse_config

    config = json_format.MessageToDict(parse_config((Path(folder) / "config.pbtxt").read_text()),
                                       preserving_proto_field_name=True)
    args = {"model_config": json.dumps(config), "model_repository": str(folder), "model_version": "1"}
    model = StreamingModel(args, StandinStub)
    model.runner.close()
    return model


def in_process_tokens_per_s(model, prompts: Sequence[bytes], concurrency: int, max_tokens: int,
                            seconds: float = 3.0, clock: Callable[[], float] = time.perf_counter) -> float:
    """Tokens/s of the model's own loop in this process, `concurrency` streams kept live (a new
    one joins as one ends), nothing sent: the batched loop the served model is bounded by.
    `clock` is what a second is: wall time, or `time.thread_time`, the loop's own CPU time (the
    window is `seconds` of wall time either way)."""
    from latte.backend.streaming.controls import read_controls
    from latte.backend.streaming.streams import Stream

    runner = model.runner
    controls = read_controls({}, {"max_tokens": max_tokens, "ignore_eos": True}, max_tokens, False)
    count = [0]

    def new_stream() -> Stream:
        prompt = prompts[count[0] % len(prompts)]
        count[0] += 1
        return Stream({"text_input": np.array([prompt], dtype=object)}, controls, time.monotonic())

    runner.submit([new_stream() for _ in range(concurrency)])
    tokens, started, warm = 0, None, time.perf_counter() + min(1.0, seconds / 3)
    counted_from = 0.0
    while True:
        emissions = runner.run_once()
        now = time.perf_counter()
        if started is None and now >= warm:
            started, tokens, counted_from = now, 0, clock()
        tokens += sum(1 for _, outcome, _ in emissions if isinstance(outcome, dict))
        ended = sum(1 for _, _, final in emissions if final)
        if ended:
            runner.submit([new_stream() for _ in range(ended)])
        if started is not None and now - started >= seconds:
            break
    counted = clock() - counted_from
    while not runner.idle:  # the streams still running end, so the next measurement starts empty
        for stream in list(runner.engine.live):
            stream.cancelled = True
        runner.run_once()
    return tokens / counted if started and counted > 0 else 0.0


# The echo's clients for in_process_beside_echo, in a process of their own: in this one they
# would share the loop's interpreter lock, which the served model's clients do not.
_ECHO_CLIENTS = """
import sys
from latte.bench.streams import BENCH_PROMPTS
from latte.triton.streams import run_streams
url, model, concurrency, seconds, max_tokens = sys.argv[1:]
print("streaming", flush=True)
try:
    records = run_streams(url, model, list(BENCH_PROMPTS), concurrency=int(concurrency), max_tokens=int(max_tokens),
                          duration_s=float(seconds), ignore_eos=True)
except Exception as exc:  # one line for the caller's error: gRPC's own text is several
    details = getattr(exc, "details", None)
    sys.exit(details() if callable(details) else f"{type(exc).__name__}: {exc}")
print(sum(len(record.arrivals) for record in records))
"""
# How long the echo's clients stream before the loop starts, once they are started: to
# connect and send their first requests.
ECHO_LEAD_S = 1.0
# The echo's clients' own start (an interpreter, tritonclient's imports), at most.
ECHO_START_S = 60.0


def in_process_beside_echo(model, grpc_url: str, echo_model: str, prompts: Sequence[bytes], concurrency: int,
                           max_tokens: int, seconds: float = 3.0) -> float:
    """Tokens per second of the loop's own CPU time (`in_process_tokens_per_s` on
    `time.thread_time`) while `concurrency` clients in another process stream from the echo
    model (each request BENCH_PROMPTS' next, for `max_tokens` responses): what a token's share
    of the loop costs with the responses' traffic (server, stub, clients) on the same cores, as
    it runs beside a served model's loop. The loop's thread must be the only one it computes
    on (intra_op_threads 1, on the CPU), or its CPU time would miss the rest."""
    serving = model.spec.serving
    if serving.intra_op_threads != 1 or serving.device != "cpu":
        raise ValueError(f"the loop's CPU time counts its own thread only: serve it with intra_op_threads=1 on the "
                         f"CPU, not {serving.intra_op_threads} on {serving.device}")
    with tempfile.TemporaryFile("w+") as errors:
        clients = subprocess.Popen([sys.executable, "-c", _ECHO_CLIENTS, grpc_url, echo_model, str(concurrency),
                                    str(ECHO_LEAD_S + seconds + 2.0), str(max_tokens)],
                                   stdout=subprocess.PIPE, stderr=errors, text=True)
        try:
            started = select.select([clients.stdout], [], [], ECHO_START_S)[0] and clients.stdout.readline()
            if started:
                time.sleep(ECHO_LEAD_S)
                rate = in_process_tokens_per_s(model, prompts, concurrency, max_tokens, seconds,
                                               clock=time.thread_time)
            received = clients.communicate(timeout=ECHO_LEAD_S + seconds + ECHO_START_S)[0]
        except BaseException:
            clients.kill()
            clients.communicate()
            raise
        if clients.returncode != 0 or not started:
            errors.seek(0)
            said = errors.read().strip()
            raise RuntimeError(f"the echo's clients failed (exit {clients.returncode}): "
                               f"{said.splitlines()[-1] if said else 'no message'}")
    if not received.strip() or int(received.split()[-1]) == 0:
        # Measured beside nothing, the loop would pass for one beside the echo.
        raise RuntimeError(f"the echo's clients received no tokens from {echo_model!r} at {grpc_url}")
    return rate


def harmonic_bound(echo: float, in_process: float) -> float:
    """H = 1 / (1/echo + 1/in-process): each token pays its response (the echo's rate) and its
    share of the batched loop (the in-process rate), one after the other."""
    return 1.0 / (1.0 / echo + 1.0 / in_process) if echo > 0 and in_process > 0 else 0.0


# What `latte bench` sends a streaming model: prompts of several lengths.
BENCH_PROMPTS = [b"Once upon a time", b"The quick brown fox jumps", b"hello", b"Streams join and leave between steps",
                 b"a b c d e f g", b"Triton serves models", b"what comes next?", b"0123456789"]


def is_decoupled(grpc_url: str, model: str) -> bool:
    """Whether the served model streams (its config says decoupled)."""
    import tritonclient.grpc as grpcclient

    config = grpcclient.InferenceServerClient(grpc_url).get_model_config(model, as_json=True)["config"]
    return bool(config.get("model_transaction_policy", {}).get("decoupled", False))


def run_stream_bench(grpc_url: str, model: str, levels: Sequence[int], seconds: float, max_tokens: int,
                     prompts: Sequence[bytes] = BENCH_PROMPTS, on_level=lambda level, figures: None) -> Dict:
    """Each level of concurrent streams for `seconds` (after a second's warm-up): tokens/s, TTFT,
    inter-token latency, streams in flight; every request asks for `max_tokens` outputs."""
    warm_streams(grpc_url, model, prompts)
    points = []
    for level in levels:
        figures = measure_streams(grpc_url, model, level, seconds, max_tokens, prompts).as_dict()
        points.append({"concurrent": level, **figures})
        on_level(level, figures)
    return {"model": model, "kind": "streams", "max_tokens": max_tokens, "seconds": seconds, "points": points}


# Streams measured after this long: the first ones all join at once.
WARM_S = 1.0


def warm_streams(grpc_url: str, model: str, prompts: Sequence[bytes] = BENCH_PROMPTS) -> None:
    """A few short streams, so the first measured ones do not pay the model's first calls."""
    from latte.triton.streams import run_streams

    run_streams(grpc_url, model, list(prompts), concurrency=2, max_tokens=4)


def measure_streams(grpc_url: str, model: str, concurrent: int, seconds: float, max_tokens: int,
                    prompts: Sequence[bytes] = BENCH_PROMPTS, cpu: Optional[CpuReader] = None,
                    **sampling) -> StreamFigures:
    """`concurrent` clients streaming for `seconds` after WARM_S, each request asking for
    `max_tokens` outputs (the end token ignored) and any other `sampling` keys: what the window
    shows, with the machine's cores busy meanwhile and, where `cpu` reads processes' CPU
    seconds by name, each one's cores."""
    from latte.triton.streams import run_streams

    started = time.perf_counter()
    busy = BusyCores(WARM_S, seconds, cpu)
    records = run_streams(grpc_url, model, list(prompts), concurrency=concurrent, max_tokens=max_tokens,
                          duration_s=seconds + WARM_S, ignore_eos=True, **sampling)
    figures = stream_figures(records, started + WARM_S, started + WARM_S + seconds)
    cores = busy.result()
    return dataclasses.replace(figures, busy_cores=cores.pop("machine", None), process_cores=cores or None)


class BusyCores:
    """CPU seconds read when a window opens and when it closes (timers beside the clients'
    event loop), as cores busy on average: the machine's, and those `read` names (a process or
    a group of them)."""

    def __init__(self, opens_in: float, seconds: float, read: Optional[CpuReader] = None) -> None:
        self._read_more = read
        self._readings: Dict[str, Tuple[float, Dict[str, float]]] = {}
        self._timers = [threading.Timer(opens_in, self._read, ("open",)),
                        threading.Timer(opens_in + seconds, self._read, ("close",))]
        for timer in self._timers:
            timer.daemon = True
            timer.start()

    def _read(self, which: str) -> None:
        seconds: Dict[str, float] = {}
        try:
            seconds["machine"] = box_busy_seconds()
            if self._read_more is not None:
                seconds.update(self._read_more())
        except OSError:  # no /proc here, or a process gone: the figures are left out
            return
        self._readings[which] = (time.perf_counter(), seconds)

    def result(self) -> Dict[str, float]:
        """Cores busy by name ("machine" for the whole machine); empty where a reading failed."""
        for timer in self._timers:
            timer.join()
        if len(self._readings) < 2:
            return {}
        (t0, opened), (t1, closed) = self._readings["open"], self._readings["close"]
        if t1 <= t0:
            return {}
        return {name: (closed[name] - opened[name]) / (t1 - t0) for name in closed if name in opened}
