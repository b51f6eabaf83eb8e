"""What serving through tritonserver and the latte backend costs on this machine.

An in-process profile times the model alone. Served, every batch also pays for the
launch (the Python backend's IPC to its stub, the backend's execute loop) and every
request in it for decoding, padding and its response, and each request pays the
client-server round trip once. `calibrate()` measures those costs on a real server with
an ONNX Identity model, whose own compute is nil:

- at concurrency 1 every batch holds one request: the server's compute time is
  batch_ms + request_ms, and mean latency minus queue and compute is the round trip;
- at concurrency B behind a batcher that waits for B requests, the compute time of a
  batch of average size b (Triton's execution and inference counts) is batch_ms + b x request_ms,
  and its throughput is the host's request ceiling: no model is served faster than one
  that computes nothing, with the load generator on the same host;
- the same with requests LARGE_WIDTH floats wide: the ceiling falls with the bytes each
  request carries (copies through gRPC and the stub's shared memory), per KiB.

Two points, one line. The result is stored with the profile (`Profile.serving`), and
kept per machine (`machine_serving_cost`): it describes the host, the server and the
backend, not the model, so later profiles on the same machine reuse it for a week.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

# Widths of the identity model's one FP32 input: a small request (256 B), and a large one
# (16 KiB, a 3x32x32 image is 12 KiB) for the cost of the bytes.
IDENTITY_WIDTH = 64
LARGE_WIDTH = 4096
# Requests in flight (and the preferred batch) for the batched point.
CALIBRATION_BATCH = 16
# The batcher waits this long for a full batch; closed-loop clients refill it well before.
FILL_WAIT_US = 50_000
MEASUREMENT_MS = 1500


class CalibrationError(RuntimeError):
    """The calibration server or its measurement failed."""


@dataclass(frozen=True)
class ServingCost:
    """Per-batch and per-request serving cost outside the model, in milliseconds."""
    batch_ms: float = 0.0
    request_ms: float = 0.0
    round_trip_ms: float = 0.0
    max_rate: float = 0.0         # requests/s the identity model was served at; 0: not measured
    kib_ms: float = 0.0           # host time per KiB of request beyond the small identity request
    source: str = "none"          # "calibrated", "spec" (backend_overhead_ms) or "assumed"

    def batch_overhead_ms(self, batch_size: int) -> float:
        """Added to the model's own latency for one batch of batch_size requests."""
        return self.batch_ms + self.request_ms * batch_size

    def request_ceiling(self, request_bytes: int) -> float:
        """Requests/s this host serves for a model that computes nothing, at this request size; 0: unknown."""
        if not self.max_rate:
            return 0.0
        extra_kib = max(0.0, (request_bytes - IDENTITY_WIDTH * 4) / 1024.0)
        return 1.0 / (1.0 / self.max_rate + extra_kib * self.kib_ms / 1000.0)

    def describe(self) -> str:
        if self.source == "calibrated":
            return (f"calibrated serving cost: {self.batch_ms:.3f} ms per batch + {self.request_ms:.3f} ms per "
                    f"request, {self.round_trip_ms:.3f} ms client round trip, at most {self.max_rate:.0f} requests/s "
                    f"(+{self.kib_ms:.3f} ms per KiB of request)")
        return f"serving cost {self.batch_ms:g} ms per batch ({self.source}; not measured on a server)"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "ServingCost":
        return cls(batch_ms=float(data.get("batch_ms", 0.0)), request_ms=float(data.get("request_ms", 0.0)),
                   round_trip_ms=float(data.get("round_trip_ms", 0.0)), max_rate=float(data.get("max_rate", 0.0)),
                   kib_ms=float(data.get("kib_ms", 0.0)), source=str(data.get("source", "calibrated")))

    @classmethod
    def flat(cls, batch_ms: float, source: str) -> "ServingCost":
        return cls(batch_ms=batch_ms, source=source)


def fit(single_compute_ms: float, batched_compute_ms: float, batch_size: float, round_trip_ms: float,
        max_rate: float = 0.0, large_rate: float = 0.0) -> ServingCost:
    """The line through (1, single_compute_ms) and (batch_size, batched_compute_ms), never negative;
    the cost per KiB from the ceilings at IDENTITY_WIDTH and LARGE_WIDTH floats per request."""
    kib = (LARGE_WIDTH - IDENTITY_WIDTH) * 4 / 1024.0
    kib_ms = max(0.0, (1.0 / large_rate - 1.0 / max_rate) * 1000.0 / kib) if large_rate and max_rate else 0.0
    if batch_size > 1.05:
        request_ms = max(0.0, (batched_compute_ms - single_compute_ms) / (batch_size - 1))
    else:  # the batcher formed no batches: nothing separates the two costs
        request_ms = 0.0
    batch_ms = max(0.0, single_compute_ms - request_ms)
    return ServingCost(batch_ms=batch_ms, request_ms=request_ms, round_trip_ms=max(0.0, round_trip_ms),
                       max_rate=max_rate, kib_ms=kib_ms, source="calibrated")


def write_identity_onnx(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", "width"])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", "width"])
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _identity_context(name: str, dynamic_batching: Optional[dict]) -> dict:
    return {
        "name": name, "backend": "latte", "max_batch_size": CALIBRATION_BATCH,
        "inputs": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "outputs": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "dynamic_batching": dynamic_batching,
        "instance_groups": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {"model_file": "model.onnx", "runtime": "onnx", "intra_op_threads": "1",
                       "inter_op_threads": "1"},
    }


def write_calibration_repository(repo: Path) -> Path:
    """Two identity models: one without a batcher, one that waits for CALIBRATION_BATCH requests."""
    from latte.generator.model_folder import write_model

    model = write_identity_onnx(Path(repo).parent / "identity.onnx")
    write_model(repo, _identity_context("identity_single", None), {"model.onnx": model})
    write_model(repo, _identity_context("identity_batched", {
        "max_queue_delay_microseconds": FILL_WAIT_US, "preferred_batch_size": [CALIBRATION_BATCH]}),
        {"model.onnx": model})
    return Path(repo)


def _counts(client, model: str):
    stats = client.get_inference_statistics(model).model_stats[0]
    return stats.inference_count, stats.execution_count


def calibrate(install=None, log: Callable[[str], None] = lambda line: None) -> ServingCost:
    """Measure this machine's serving cost on a fresh tritonserver (about 15 s)."""
    import tritonclient.grpc as grpcclient

    from latte.triton import TritonServer
    from latte.triton.perf import PerfAnalyzerError, run_perf_analyzer, write_input_data

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="latte-calibrate-") as tmp:
        repo = write_calibration_repository(Path(tmp) / "repo")
        rng = np.random.default_rng(0)
        small, large = [write_input_data(Path(tmp) / f"inputs{width}.json",
                                         [{"INPUT0": rng.standard_normal(width).astype(np.float32)}])
                        for width in (IDENTITY_WIDTH, LARGE_WIDTH)]
        log("calibrating the serving cost on tritonserver (identity model)")
        try:
            with TritonServer(repo, install=install) as server:
                client = grpcclient.InferenceServerClient(server.grpc_url)

                def measure(model: str, level: int, data: Path = small):
                    before = _counts(client, model)
                    # Any three windows within 2x of each other: the cost is their mean, and a
                    # busy host's swings must not abort the calibration.
                    point = run_perf_analyzer(model, server.grpc_url, concurrency=[level], input_data=data,
                                              measurement_ms=MEASUREMENT_MS, max_trials=10,
                                              stability_percentage=100.0)[0]
                    after = _counts(client, model)
                    executions = max(1, after[1] - before[1])
                    return point, (after[0] - before[0]) / executions

                single, _ = measure("identity_single", 1)
                batched, batch = measure("identity_batched", CALIBRATION_BATCH)
                wide, _ = measure("identity_batched", CALIBRATION_BATCH, large)
        except PerfAnalyzerError as exc:
            raise CalibrationError(f"calibration failed: {exc}") from None
    # The mean, not P99: the model's own P99 already carries the host's jitter, and adding
    # a second tail on top would count the same hiccups twice.
    round_trip = single.avg_ms - (single.queue_us + single.compute_us) / 1000.0
    cost = fit(single.compute_us / 1000.0, batched.compute_us / 1000.0, batch, round_trip, batched.throughput,
               wide.throughput)
    log(f"{cost.describe()} (average batch {batch:.1f}; {time.perf_counter() - started:.0f} s)")
    return cost


# A calibration describes the host and the serving stack; after this long it is taken again.
CACHE_MAX_AGE_S = 7 * 24 * 3600


def calibration_cache_dir() -> Path:
    """Where machine calibrations are kept: $LATTE_CACHE_DIR, else $XDG_CACHE_HOME/latte, else ~/.cache/latte."""
    if os.environ.get("LATTE_CACHE_DIR"):
        return Path(os.environ["LATTE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "latte"


def machine_key(install) -> dict:
    """What a calibration depends on: the host's CPU and usable cores, the tritonserver
    binary and the latte version. Any change means a new calibration."""
    from latte import __version__
    from latte.backend.config import cpu_model, usable_cores

    server = Path(install.server)
    stat = server.stat() if server.exists() else None
    return {"host": platform.node(), "cpu": cpu_model() or platform.processor(), "cores": usable_cores(),
            "tritonserver": str(server),
            "tritonserver_bytes": stat.st_size if stat else 0, "latte": __version__}


def kept_per_machine(filename: str, measure: Callable, to_json: Callable, from_json: Callable, install=None,
                     log: Callable[[str], None] = lambda line: None, refresh: bool = False,
                     cache_dir: Optional[Path] = None, describe: Callable = str):
    """A measurement of this machine: the one kept in the cache folder under `filename` when it
    matches the machine and is under a week old (unless `refresh`), else `measure(install, log)`,
    kept for next time."""
    from latte.triton import find_triton

    install = install or find_triton()
    key = machine_key(install)
    path = (cache_dir or calibration_cache_dir()) / filename
    if not refresh:
        try:
            kept = json.loads(path.read_text())
            age = time.time() - float(kept["measured_at"])
            if kept["machine"] == key and 0 <= age < CACHE_MAX_AGE_S:
                value = from_json(kept["cost"])
                log(f"{describe(value)} (kept from {age / 3600:.1f} h ago in {path}; --recalibrate measures again)")
                return value
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none kept, unreadable, or of another format: measure
    value = measure(install, log)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"machine": key, "measured_at": time.time(), "cost": to_json(value)}, indent=2))
        tmp.replace(path)
    except OSError as exc:  # a read-only home still gets its calibration, just not kept
        log(f"could not keep the calibration in {path}: {exc}")
    return value


def machine_serving_cost(install=None, log: Callable[[str], None] = lambda line: None,
                         refresh: bool = False, cache_dir: Optional[Path] = None) -> ServingCost:
    """This machine's serving cost: the kept calibration when one matches the machine and
    is under a week old (unless `refresh`), else a new one (`calibrate`), kept for next time."""
    return kept_per_machine("serving-cost.json", calibrate, ServingCost.to_json, ServingCost.from_json, install, log,
                            refresh, cache_dir, ServingCost.describe)
