"""`latte verify`: serve the repository, load a model at the load it is meant for, check the P99 SLO.

The load is the one `latte generate` planned the settings for (REPO/latte_plan.json): the
spec's arrival rate, else 80% of the throughput the derivation promised at the SLO, sent
as Poisson arrivals, as independent clients send them. A repository without a plan, or
an explicit --concurrency, is driven in closed loop instead. When the SLO does not hold,
the server's own split of the time (queue vs compute, from perf_analyzer) picks the one
setting to change.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Union

import numpy as np

from latte.generator.operating_point import read_operating_points
from latte.generator.validate import validate_repository

if TYPE_CHECKING:
    from latte.generator.verify_streams import StreamVerifyReport

# Queue and compute below this share of the median latency: the time went elsewhere.
SERVER_SHARE = 0.5
# Triton's answer when a request finds the model's queue at max_queue_size.
QUEUE_FULL = "Exceeds maximum queue size"


class VerifyError(RuntimeError):
    """The model cannot be verified as asked (unknown model, no inputs perf_analyzer can send)."""


@dataclass
class VerifyReport:
    model: str
    slo_ms: float
    concurrency: Optional[int]    # closed loop: requests in flight
    p99_ms: float
    p50_ms: float
    throughput: float
    queue_us: float
    compute_us: float
    suggestion: Optional[str]
    rate: Optional[float] = None  # Poisson arrivals: requests/s
    load_source: str = ""         # why this load

    @property
    def load(self) -> str:
        if self.rate is not None:
            return f"{self.rate:.0f} req/s Poisson"
        return f"concurrency {self.concurrency}"

    @property
    def slo_met(self) -> bool:
        return self.p99_ms <= self.slo_ms

    def text(self) -> str:
        verdict = "holds" if self.slo_met else "does NOT hold"
        lines = [f"{self.model}: P99 {self.p99_ms:.2f} ms vs SLO {self.slo_ms:g} ms: the SLO {verdict}",
                 f"  load: {self.load}" + (f" ({self.load_source})" if self.load_source else ""),
                 f"  throughput {self.throughput:.1f} infer/s (P50 {self.p50_ms:.2f} ms; server queue "
                 f"{self.queue_us:.0f} us, compute {self.compute_us:.0f} us)"]
        if self.suggestion:
            lines.append(f"  suggestion: {self.suggestion}")
        return "\n".join(lines)


def batching_config(configs: Dict, model: str):
    """The config whose batching sets the operating point: the model, or an ensemble's batching step."""
    config = configs[model]
    if config.platform != "ensemble":
        return config
    steps = [configs[s.model_name] for s in config.ensemble_scheduling.step if s.model_name in configs]
    batching = [c for c in steps if c.HasField("dynamic_batching")]
    return batching[0] if batching else config


def operating_concurrency(config) -> int:
    instances = sum(g.count or 1 for g in config.instance_group) or 1
    concurrency = instances * max(1, config.max_batch_size)
    queue = config.dynamic_batching.default_queue_policy.max_queue_size
    # More requests in flight than the queue admits would be rejected, not measured.
    return min(concurrency, queue) if queue else concurrency


def suggest(config, report: VerifyReport, cores: Optional[int] = None) -> Optional[str]:
    """One corrected setting when the SLO fails, from where the time went; None when it holds."""
    if report.slo_met:
        return None
    over_ms = report.p99_ms - report.slo_ms
    delay = config.dynamic_batching.max_queue_delay_microseconds
    server_ms = (report.queue_us + report.compute_us) / 1000.0
    if server_ms < SERVER_SHARE * report.p50_ms:
        return (f"{config.name}: only {server_ms:.2f} ms of the P50 {report.p50_ms:.2f} ms is spent in this model's "
                "queue and compute; the rest is outside it (the client, other ensemble steps, a host busy with "
                "other work), so no setting of this model fixes it: measure on a quieter host, give the slow "
                "ensemble step more instances, or lower the load")
    if report.queue_us > report.compute_us:
        if delay > 0:
            new_delay = max(0, int(delay - over_ms * 1000))
            return (f"{config.name}: requests wait longer in the queue ({report.queue_us:.0f} us) than they compute "
                    f"({report.compute_us:.0f} us); lower dynamic_batching.max_queue_delay_microseconds from {delay} "
                    f"to {new_delay}")
        instances = sum(g.count or 1 for g in config.instance_group) or 1
        if cores is None or instances < cores:
            return (f"{config.name}: requests queue ({report.queue_us:.0f} us) behind busy instances with no "
                    f"batching delay to blame: the load exceeds what {instances} instance(s) serve; raise "
                    f"instance_group count to {instances + 1}")
        return (f"{config.name}: requests queue ({report.queue_us:.0f} us) behind {instances} busy instance(s) on "
                f"{cores} core(s): the load exceeds this host; lower the rate or add hardware")
    if config.max_batch_size > 1:
        return (f"{config.name}: one batch takes too long for the SLO under this load; lower max_batch_size from "
                f"{config.max_batch_size} to {config.max_batch_size // 2} (or re-run `latte generate` with a "
                "profile taken under the same load)")
    return (f"{config.name}: a single request already misses the SLO by {over_ms:.1f} ms; relax the SLO, add "
            "hardware (instance_group count within the cores) or use a faster model")


def rejected_report(model: str, batching, slo_ms: float, load: Load) -> VerifyReport:
    """The verdict when the server rejected requests: the queue overflowed, so the SLO cannot hold."""
    queue = batching.dynamic_batching.default_queue_policy.max_queue_size
    report = VerifyReport(model=model, slo_ms=slo_ms, concurrency=load.concurrency, p99_ms=float("inf"),
                          p50_ms=float("inf"), throughput=0.0, queue_us=0.0, compute_us=0.0, rate=load.rate,
                          load_source=load.source,
                          suggestion=(f"{batching.name}: the server rejected requests ({QUEUE_FULL.lower()} "
                                      f"{queue}): its instances cannot keep up with this load; lower the rate, or "
                                      f"search instances and batch sizes with `latte tune`"))
    return report


def _sample(data_type: str, dims: List[int], rng: np.random.Generator) -> np.ndarray:
    from latte.backend.samples import sample_values

    if data_type == "TYPE_STRING":
        words = ["latte", "serves", "ragged", "text", "batches", "quickly"]
        return np.array([" ".join(rng.choice(words, size=5)) for _ in range(int(np.prod(dims)))]).reshape(dims)
    return sample_values(data_type, dims, rng)


def input_samples(config, length: int, count: int = 8, seed: int = 0) -> List[Dict[str, np.ndarray]]:
    from tritonclient.grpc import model_config_pb2

    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        sample = {}
        for t in config.input:
            dims = [length if d == -1 else d for d in t.dims]
            sample[t.name] = _sample(model_config_pb2.DataType.Name(t.data_type), dims, rng)
        samples.append(sample)
    return samples


@dataclass(frozen=True)
class Load:
    """What perf_analyzer sends: Poisson arrivals at a rate, or a closed loop of clients."""
    rate: Optional[float]
    concurrency: Optional[int]
    source: str

    def perf_args(self) -> dict:
        if self.rate is not None:
            return {"request_rate": [round(self.rate, 1)], "extra_args": ["--request-distribution", "poisson",
                                                                           "--async"]}
        return {"concurrency": [self.concurrency]}


def intended_load(repo: Path, batching, slo_ms: Optional[float], rate: Optional[float] = None,
                  concurrency: Optional[int] = None, model: Optional[str] = None):
    """The load to verify at and the SLO to hold, from the flags, else the repository's plan
    for the model (an ensemble's own, else its batching step's)."""
    plans = read_operating_points(repo)
    name = model if model in plans else batching.name
    planned = plans.get(name)
    slo = slo_ms if slo_ms is not None else (planned.slo_ms if planned else None)
    if slo is None:
        raise VerifyError(f"give --slo-ms: {repo} has no plan from `latte generate` naming {name}'s SLO")
    if slo <= 0:
        raise VerifyError(f"--slo-ms must be positive, got {slo}")
    if rate is not None and rate <= 0:
        raise VerifyError(f"--rate must be positive (requests/s), got {rate}")
    if concurrency is not None and concurrency < 1:
        raise VerifyError(f"--concurrency must be >= 1, got {concurrency}")
    if rate is not None:
        return Load(rate, None, "--rate"), slo
    if concurrency is not None:
        return Load(None, concurrency, "--concurrency"), slo
    if planned is not None:
        source = "the spec's arrival_rate" if planned.rate_source == "arrival_rate" else \
            "80% of the throughput the derivation promised at the SLO"
        return Load(planned.rate, None, f"{name}'s planned load: {source}"), slo
    return Load(None, operating_concurrency(batching),
                "no plan in the repository: every instance busy with a full batch"), slo


# Distinct requests drawn from a length distribution: enough for its tail to show.
DRAWN_REQUESTS = 64
# The longest variable dimension drawn when the config names no max_sequence_length.
DEFAULT_MAX_LENGTH = 128


def request_samples(config, length: int = 16, lengths=None, seed: int = 0) -> List[Dict[str, np.ndarray]]:
    """The requests perf_analyzer sends: every variable dimension at `length`, or, given a
    LengthDistribution `lengths`, each request at a length of its own drawn from it (up to the
    config's max_sequence_length): traffic of mixed lengths batches and pads as served traffic
    does, which one length never shows."""
    if lengths is None or not any(-1 in t.dims for t in config.input):
        return input_samples(config, length, seed=seed)
    raw = config.parameters["max_sequence_length"].string_value if "max_sequence_length" in config.parameters else ""
    maximum = int(raw) if raw.strip().isdecimal() and int(raw) > 0 else DEFAULT_MAX_LENGTH
    drawn = lengths.sample(np.random.default_rng(seed), DRAWN_REQUESTS, maximum)
    return [input_samples(config, int(n), count=1, seed=seed + i)[0] for i, n in enumerate(drawn)]


def verify(repo: Path, model: str, slo_ms: Optional[float] = None, install=None, concurrency: Optional[int] = None,
           length: int = 16, measurement_ms: int = 3000, url: Optional[str] = None,
           rate: Optional[float] = None, lengths=None, ttft_ms: Optional[float] = None,
           itl_ms: Optional[float] = None) -> Union[VerifyReport, "StreamVerifyReport"]:
    """Measure MODEL in REPO with perf_analyzer (starting tritonserver unless url is given);
    variable dimensions at `length`, or drawn from the LengthDistribution `lengths`. A
    streaming (decoupled) model is measured as concurrent streams against its TTFT and
    inter-token SLOs instead (verify_streams.py)."""
    from latte.backend.config import usable_cores
    from latte.triton.perf import PerfAnalyzerError, run_perf_analyzer, write_input_data

    configs = validate_repository(repo)
    if model not in configs:
        raise VerifyError(f"model {model!r} is not in {repo} (models: {', '.join(sorted(configs))})")
    config = configs[model]
    if config.model_transaction_policy.decoupled:
        from latte.generator.verify_streams import verify_streams

        if rate is not None:
            raise VerifyError(f"{model} streams: it is verified with --concurrency streams, not a --rate")
        return verify_streams(Path(repo), config, ttft_ms, itl_ms if itl_ms is not None else slo_ms, concurrency,
                              measurement_ms, url, install)
    batching = batching_config(configs, model)
    load, slo_ms = intended_load(Path(repo), batching, slo_ms, rate, concurrency, model)
    with tempfile.TemporaryDirectory(prefix="latte-verify-") as tmp:
        data = write_input_data(Path(tmp) / "inputs.json", request_samples(config, length, lengths))

        def measure(server_url: str):
            # A wide stability band: on a shared machine the default rarely settles, and the
            # verdict rests on P99 against the SLO, not on a tight throughput estimate.
            try:
                return run_perf_analyzer(model, server_url, protocol="grpc", input_data=data,
                                         measurement_ms=measurement_ms, max_trials=8, stability_percentage=100.0,
                                         **load.perf_args())[0]
            except PerfAnalyzerError as exc:
                if QUEUE_FULL not in str(exc):
                    raise
                return None  # perf_analyzer stops at the first rejection: the load overflowed the queue

        if url:
            point = measure(url)
        else:
            from latte.triton import TritonServer

            with TritonServer(repo, install=install) as server:
                point = measure(server.grpc_url)
    if point is None:
        return rejected_report(model, batching, slo_ms, load)
    report = VerifyReport(model=model, slo_ms=slo_ms, concurrency=load.concurrency, p99_ms=point.p99_ms,
                          p50_ms=point.p50_ms, throughput=point.throughput, queue_us=point.queue_us,
                          compute_us=point.compute_us, suggestion=None, rate=load.rate, load_source=load.source)
    report.suggestion = suggest(batching, report, usable_cores())
    return report
