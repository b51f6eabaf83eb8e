"""`latte verify`: serve the repository, load a model at its operating point, check the P99 SLO.

The operating point is the load the derivation planned for: every instance of the
model's batching step busy with a full batch, i.e. instances x max_batch_size requests
in flight. When the SLO does not hold, the server's own split of the time (queue vs
compute, from perf_analyzer) picks the one setting to change.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from latte.generator.validate import validate_repository


class VerifyError(RuntimeError):
    """The model cannot be verified as asked (unknown model, no inputs perf_analyzer can send)."""


@dataclass
class VerifyReport:
    model: str
    slo_ms: float
    concurrency: int
    p99_ms: float
    p50_ms: float
    throughput: float
    queue_us: float
    compute_us: float
    suggestion: Optional[str]

    @property
    def slo_met(self) -> bool:
        return self.p99_ms <= self.slo_ms

    def text(self) -> str:
        verdict = "holds" if self.slo_met else "does NOT hold"
        lines = [f"{self.model}: P99 {self.p99_ms:.2f} ms vs SLO {self.slo_ms:g} ms: the SLO {verdict}",
                 f"  throughput {self.throughput:.1f} infer/s at concurrency {self.concurrency} "
                 f"(P50 {self.p50_ms:.2f} ms; server queue {self.queue_us:.0f} us, compute {self.compute_us:.0f} us)"]
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


def suggest(config, report: VerifyReport) -> Optional[str]:
    """One corrected setting when the SLO fails; None when it holds."""
    if report.slo_met:
        return None
    over_ms = report.p99_ms - report.slo_ms
    delay = config.dynamic_batching.max_queue_delay_microseconds
    if report.queue_us > report.compute_us and delay > 0:
        new_delay = max(0, int(delay - over_ms * 1000))
        return (f"{config.name}: requests wait longer in the queue ({report.queue_us:.0f} us) than they compute; "
                f"lower dynamic_batching.max_queue_delay_microseconds from {delay} to {new_delay}")
    if config.max_batch_size > 1:
        return (f"{config.name}: one batch takes too long for the SLO under this load; lower max_batch_size from "
                f"{config.max_batch_size} to {config.max_batch_size // 2} (or re-run `latte generate` with a "
                "profile taken under the same load)")
    return (f"{config.name}: a single request already misses the SLO by {over_ms:.1f} ms; relax the SLO, add "
            "hardware (instance_group count within the cores) or use a faster model")


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


def verify(repo: Path, model: str, slo_ms: float, install=None, concurrency: Optional[int] = None,
           length: int = 16, measurement_ms: int = 3000, url: Optional[str] = None) -> VerifyReport:
    """Measure MODEL in REPO with perf_analyzer (starting tritonserver unless url is given)."""
    from latte.triton.perf import run_perf_analyzer, write_input_data

    if slo_ms <= 0:
        raise VerifyError(f"--slo-ms must be positive, got {slo_ms}")
    configs = validate_repository(repo)
    if model not in configs:
        raise VerifyError(f"model {model!r} is not in {repo} (models: {', '.join(sorted(configs))})")
    config = configs[model]
    batching = batching_config(configs, model)
    level = concurrency or operating_concurrency(batching)
    with tempfile.TemporaryDirectory(prefix="latte-verify-") as tmp:
        data = write_input_data(Path(tmp) / "inputs.json", input_samples(config, length))

        def measure(server_url: str):
            # A wide stability band: on a shared machine the default rarely settles, and the
            # verdict rests on P99 against the SLO, not on a tight throughput estimate.
            return run_perf_analyzer(model, server_url, protocol="grpc", concurrency=[level], input_data=data,
                                     measurement_ms=measurement_ms, max_trials=8, stability_percentage=60.0)[0]

        if url:
            point = measure(url)
        else:
            from latte.triton import TritonServer

            with TritonServer(repo, install=install) as server:
                point = measure(server.grpc_url)
    report = VerifyReport(model=model, slo_ms=slo_ms, concurrency=level, p99_ms=point.p99_ms, p50_ms=point.p50_ms,
                          throughput=point.throughput, queue_us=point.queue_us, compute_us=point.compute_us,
                          suggestion=None)
    report.suggestion = suggest(batching, report)
    return report
