"""What one iteration of a streaming model costs against the number of live streams: what
`latte profile stream.json` measures and `latte generate` derives max_streams and
joins_per_iteration from (derive_streams.py).

The model is loaded in this process as the backend serves it (its start and step graphs on
the one graph runner, its pools in the arena), and driven by its own iteration loop with
nothing sent. At each level N, N streams join in one iteration (the start cost of N joins)
and then step together until each has made `max_tokens` outputs (the step cost at N live
streams, over the lengths a stream goes through). Rounds repeat that; the first is warm-up.
The sweep stops at the level whose step passes a ceiling (the ITL SLO, in generate).

Every output a served stream makes is also one response through Triton's stub: that cost is
the machine's, not the model's, and is measured on a server (stream_cost.py) and kept with
the profile.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from latte.generator.profile_data import ProfileError, read_profile, write_profile

STREAM_PROFILE_FORMAT = "latte-stream-profile/1"
DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_MAX_TOKENS = 16
ROUNDS = 3
# A level whose iteration takes longer than this is the last: more streams only add to it.
DEFAULT_MAX_ITERATION_MS = 1000.0
# Variable dimensions of made-up inputs (a start graph that declares no samples).
SAMPLE_LENGTH = 16


@dataclass(frozen=True)
class ResponseCost:
    """What each streamed output costs through tritonserver on this machine, in milliseconds."""
    response_ms: float            # host time per response (the echo model's tokens/s, inverted)
    first_response_ms: float      # a request's first response at one stream: the round trip
    source: str = "calibrated"    # "calibrated", or how it was otherwise given
    jitter_ms: float = 0.0        # the host's tail on a stream's gaps: the echo's inter-token P99 - P50
    jitter_streams: int = 16      # ... with this many streams' responses in each gap

    def describe(self) -> str:
        return (f"{self.source} response cost: {self.response_ms * 1000:.0f} us per streamed output, "
                f"{self.first_response_ms:.2f} ms to a first response, {self.jitter_ms:.1f} ms of tail on the gaps")


@dataclass(frozen=True)
class StreamPoint:
    streams: int                  # live streams, all joining in one iteration
    start_mean_ms: float          # the iteration in which they join
    start_p99_ms: float
    step_mean_ms: float           # an iteration stepping all of them
    step_p99_ms: float

    @property
    def tokens_per_s(self) -> float:
        """Outputs per second of the loop alone at this level (nothing sent)."""
        return self.streams * 1000.0 / self.step_mean_ms


@dataclass
class StreamProfile:
    stream_file: str
    max_tokens: int
    intra_op_threads: int
    points: List[StreamPoint]
    cache_block_tokens: int = 0   # 0: the model keeps no cache
    stop_reason: str = ""
    wall_s: float = 0.0
    responses: Optional[ResponseCost] = None
    max_iteration_ms: float = DEFAULT_MAX_ITERATION_MS   # the sweep's ceiling on a step

    def covers(self, itl_ms: float) -> bool:
        """Whether every level a step within itl_ms could reach was measured."""
        return self.max_iteration_ms >= itl_ms or not self.stop_reason.startswith("a step of")

    def point(self, streams: int) -> StreamPoint:
        """The measured point at `streams`, or one between the two around it (linear), or past
        the last (its cost per stream carried on)."""
        points = sorted(self.points, key=lambda p: p.streams)
        for p in points:
            if p.streams == streams:
                return p
        below = [p for p in points if p.streams < streams]
        above = [p for p in points if p.streams > streams]
        if not below:
            return points[0]
        if not above:
            last = below[-1]
            scale = streams / last.streams
            return StreamPoint(streams, last.start_mean_ms * scale, last.start_p99_ms * scale,
                               last.step_mean_ms * scale, last.step_p99_ms * scale)
        lo, hi = below[-1], above[0]
        t = (streams - lo.streams) / (hi.streams - lo.streams)
        mix = lambda a, b: a + (b - a) * t  # noqa: E731
        return StreamPoint(streams, mix(lo.start_mean_ms, hi.start_mean_ms), mix(lo.start_p99_ms, hi.start_p99_ms),
                           mix(lo.step_mean_ms, hi.step_mean_ms), mix(lo.step_p99_ms, hi.step_p99_ms))

    @property
    def measured_streams(self) -> int:
        return max(p.streams for p in self.points)

    def to_json(self) -> dict:
        data = asdict(self)
        data["format"] = STREAM_PROFILE_FORMAT
        data["points"] = [{**asdict(p), "tokens_per_s": round(p.tokens_per_s, 1)} for p in self.points]
        return data

    def save(self, path: Path) -> Path:
        return write_profile(path, self.to_json())

    @classmethod
    def from_json(cls, data: dict, source: str = "profile") -> "StreamProfile":
        if data.get("format") != STREAM_PROFILE_FORMAT:
            raise ProfileError(f"{source}: not a streaming model's profile (format {STREAM_PROFILE_FORMAT}); "
                               "create it with `latte profile STREAM_JSON`")
        try:
            points = [StreamPoint(int(p["streams"]), float(p["start_mean_ms"]), float(p["start_p99_ms"]),
                                  float(p["step_mean_ms"]), float(p["step_p99_ms"])) for p in data["points"]]
            responses = ResponseCost(**data["responses"]) if data.get("responses") else None
            profile = cls(stream_file=str(data["stream_file"]), max_tokens=int(data["max_tokens"]),
                          intra_op_threads=int(data["intra_op_threads"]), points=points,
                          cache_block_tokens=int(data.get("cache_block_tokens", 0)),
                          stop_reason=str(data.get("stop_reason", "")), wall_s=float(data.get("wall_s", 0.0)),
                          responses=responses,
                          max_iteration_ms=float(data.get("max_iteration_ms", DEFAULT_MAX_ITERATION_MS)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(f"{source}: malformed streaming profile ({exc})") from None
        if not points or any(p.streams < 1 or p.step_mean_ms <= 0 or p.start_mean_ms <= 0 for p in points):
            raise ProfileError(f"{source}: a streaming profile needs points of >= 1 stream with positive times")
        return profile

    @classmethod
    def load(cls, path: Path) -> "StreamProfile":
        return cls.from_json(read_profile(path, "STREAM_JSON"), str(Path(path)))


def profile_inputs(definition) -> List[Dict[str, np.ndarray]]:
    """Requests a stream starts from: the start graph's samples, else made-up values (text for
    string inputs)."""
    from latte.backend.dtypes import SERVED_TYPES
    from latte.backend.samples import decode_sample, sample_values
    from latte.bench.streams import BENCH_PROMPTS

    types = {t.name: t.data_type for t in definition.start.inputs}
    if definition.start.samples:  # read as the graph reads them at load
        return [{name: decode_sample(value, SERVED_TYPES[types[name]]) for name, value in sample.items()}
                for sample in definition.start.samples]
    rng = np.random.default_rng(0)
    requests = []
    for prompt in BENCH_PROMPTS:
        request = {}
        for t in definition.start.inputs:
            dims = [SAMPLE_LENGTH if d == -1 else d for d in t.dims]
            if t.data_type == "TYPE_STRING":
                request[t.name] = np.full(dims, prompt, dtype=object)
            else:
                request[t.name] = sample_values(t.data_type, dims, rng)
        requests.append(request)
    return requests


def _level(runner, requests: Sequence[Mapping[str, np.ndarray]], streams: int, max_tokens: int):
    """One round at `streams`: the joining iteration's time and each stepping iteration's (seconds)."""
    from latte.backend.streaming.controls import read_controls
    from latte.backend.streaming.streams import Stream

    controls = read_controls({}, {"max_tokens": max_tokens, "ignore_eos": True}, max_tokens, False)
    runner.submit([Stream(dict(requests[i % len(requests)]), controls, time.monotonic()) for i in range(streams)])
    times = []
    failed = None
    while not runner.idle:
        began = time.perf_counter()
        emissions = runner.run_once()
        times.append(time.perf_counter() - began)
        failed = failed or next((o for _, o, _ in emissions if isinstance(o, Exception)), None)
    if failed is not None:
        raise ProfileError(f"a stream failed while profiling: {failed}")
    return times[0], times[1:]


def profile_stream(stream_file: Path, levels: Sequence[int] = DEFAULT_LEVELS, max_tokens: int = DEFAULT_MAX_TOKENS,
                   intra_op_threads: int = 1, max_iteration_ms: float = DEFAULT_MAX_ITERATION_MS,
                   rounds: int = ROUNDS, log: Callable[[str], None] = lambda line: None) -> StreamProfile:
    """Measure the streaming model of `stream_file` at each level of live streams (ascending),
    stopping once an iteration passes `max_iteration_ms`."""
    from latte.backend.streaming.definition import load_stream
    from latte.bench.streams import in_process_model
    from latte.generator.stream_model import scratch_model

    levels = sorted(set(int(n) for n in levels))
    if not levels or levels[0] < 1:
        raise ValueError(f"levels of live streams must be >= 1, got {list(levels)}")
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be >= 2 (a start and at least one step), got {max_tokens}")
    definition = load_stream(Path(stream_file))
    requests = profile_inputs(definition)
    started = time.perf_counter()
    top = levels[-1]
    parameters = {"model_file": "stream.json", "max_streams": top, "joins_per_iteration": top,
                  "max_tokens": max_tokens, "intra_op_threads": intra_op_threads, "response_threads": 1}
    points: List[StreamPoint] = []
    stop = f"measured every level up to {top}"
    with scratch_model(Path(stream_file), parameters) as folder:
        model = in_process_model(folder)
        try:
            for streams in levels:
                joins, steps = [], []
                for round_index in range(rounds + 1):
                    first, rest = _level(model.runner, requests, streams, max_tokens)
                    if round_index:  # the first round warms up
                        joins.append(first)
                        steps.extend(rest)
                point = StreamPoint(streams, float(np.mean(joins) * 1000), float(np.max(joins) * 1000),
                                    float(np.mean(steps) * 1000), float(np.percentile(steps, 99) * 1000))
                points.append(point)
                log(f"  {streams:>4} streams: start {point.start_mean_ms:.2f} ms, step {point.step_mean_ms:.2f} ms "
                    f"(P99 {point.step_p99_ms:.2f}), {point.tokens_per_s:.0f} tokens/s in process")
                # The step alone: an iteration holds few joins (derive_streams.py), so a heavy
                # start of all N at once says nothing about N streams running.
                if point.step_p99_ms > max_iteration_ms:
                    stop = f"a step of {streams} streams passed {max_iteration_ms:g} ms"
                    break
        finally:
            model.finalize()
    cache = definition.cache
    return StreamProfile(stream_file=str(stream_file), max_tokens=max_tokens, intra_op_threads=intra_op_threads,
                         points=points, cache_block_tokens=cache.block_tokens if cache else 0, stop_reason=stop,
                         wall_s=time.perf_counter() - started, max_iteration_ms=max_iteration_ms)
