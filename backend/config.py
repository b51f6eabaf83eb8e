"""The model config a latte model runs with, parsed and checked once at load.

Triton hands `initialize` the model config as JSON; this turns it into a `ModelSpec`
and raises `ConfigError` (never `assert`) with the offending key when it is wrong.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from latte.backend.dtypes import to_numpy
from latte.backend.errors import ConfigError
from latte.backend.planning import parse_planning

RUNTIMES = ("torchscript", "torch_export", "onnx", "tensorrt")
RUNTIME_BY_EXTENSION = {".pt": "torchscript", ".ts": "torchscript", ".pt2": "torch_export",
               ".onnx": "onnx", ".plan": "tensorrt", ".engine": "tensorrt"}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    dims: Tuple[int, ...]          # without the batch dimension; -1 = any size
    ragged: bool = False           # allow_ragged_batch: pad variable dims across a batch
    optional: bool = False
    valid_range: Optional[Tuple[int, int]] = None  # integer inputs: inclusive bounds of every value

    def shape_text(self, batched: bool) -> str:
        dims = (["-1"] if batched else []) + [str(d) for d in self.dims]
        return "[" + ", ".join(dims) + "]"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    inputs: Tuple[TensorSpec, ...]
    outputs: Tuple[TensorSpec, ...]
    max_batch_size: int
    runtime: str
    model_path: Path
    intra_op_threads: int
    inter_op_threads: int
    instance_count: int
    pad_value: float = 0.0
    max_sequence_length: Optional[int] = None
    device: str = "cpu"
    parameters: Mapping[str, str] = field(default_factory=dict)
    bucket_edges: Optional[Tuple[int, ...]] = None   # for ragged inputs; None = pad to the batch's longest
    session_input: Optional[str] = None              # ragged input whose prefix a session keeps
    session_ttl_s: float = 300.0
    max_sessions: int = 10000
    arena_bytes: int = 64 << 20
    lanes: int = 1
    warmup: bool = True
    scheduler: str = "affinity"                      # "affinity" (scheduler lanes) or "inline"; see parse
    pin_lanes: bool = False
    reject_nan: bool = False                         # refuse requests with NaN/inf in float inputs
    check_cancellation: bool = False                 # ask Triton per request whether the client gave up
    respond: str = "auto"                            # when early batches are answered (responses.EarlyAnswers)
    pipeline: bool = False                           # execute returns at once; lanes answer (see docs/backend.md)
    batch_window_us: int = 2000                      # longest a pipelined batch may wait to grow
    max_queue_size: int = 4096                       # requests the scheduler queues; past it the lowest priority is shed
    batch_planning: str = "cost"                     # "cost": cheapest plan across buckets; "bucket": one bucket per batch

    @cached_property  # read on every batch; the spec never changes
    def batched(self) -> bool:
        return self.max_batch_size > 0

    @cached_property
    def ragged_inputs(self) -> bool:
        return any(t.ragged for t in self.inputs)

    @cached_property
    def trimmed_outputs(self) -> bool:
        """Whether some output has a variable dimension, which split cuts back per request."""
        return any(-1 in t.dims for t in self.outputs)

    def input(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise KeyError(name)


def parameters_of(config: Mapping) -> Dict[str, str]:
    params = config.get("parameters") or {}
    out = {}
    for key, value in params.items():
        out[key] = value.get("string_value", "") if isinstance(value, Mapping) else str(value)
    return out


def _int_param(params: Mapping[str, str], key: str, default: Optional[int], minimum: int = 1) -> Optional[int]:
    raw = params.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"parameters[{key!r}] must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"parameters[{key!r}] must be >= {minimum}, got {value}")
    return value


def _tensor(entry: Mapping, where: str) -> TensorSpec:
    name = entry.get("name")
    if not name:
        raise ConfigError(f"{where}: every tensor needs a name")
    try:
        dtype = to_numpy(entry.get("data_type", ""))
    except ValueError as exc:
        raise ConfigError(f"{where} {name!r}: {exc}") from None
    dims = tuple(int(d) for d in entry.get("dims", []))
    if any(d == 0 or d < -1 for d in dims):
        raise ConfigError(f"{where} {name!r}: dims must be positive or -1, got {list(dims)}")
    if entry.get("reshape"):
        raise ConfigError(f"{where} {name!r}: reshape is not supported by the latte backend")
    return TensorSpec(name=name, dtype=dtype, dims=dims,
                      ragged=bool(entry.get("allow_ragged_batch", False)),
                      optional=bool(entry.get("optional", False)))


VALID_RANGE_PREFIX = "valid_range:"


def _with_valid_ranges(model: str, inputs: Tuple[TensorSpec, ...], params: Mapping[str, str]) -> Tuple[TensorSpec, ...]:
    """Inputs with the bounds parameters `valid_range:<input>` = "LOW..HIGH" declare (inclusive;
    token ids into a 1000-row embedding: "0..999"); values outside are refused at read time."""
    from dataclasses import replace

    by_name = {t.name: t for t in inputs}
    for key, value in params.items():
        if not key.startswith(VALID_RANGE_PREFIX):
            continue
        target = key[len(VALID_RANGE_PREFIX):]
        if target not in by_name:
            raise ConfigError(f"model {model!r}: parameters[{key!r}] names no input; inputs are {sorted(by_name)}")
        if by_name[target].dtype.kind not in "iu":
            raise ConfigError(f"model {model!r}: parameters[{key!r}]: a valid range needs an integer input, "
                              f"{target!r} is {by_name[target].dtype}")
        low, sep, high = value.partition("..")
        try:
            bounds = (int(low), int(high))
        except ValueError:
            bounds = None
        if not sep or bounds is None or bounds[0] > bounds[1]:
            raise ConfigError(f"model {model!r}: parameters[{key!r}] must be LOW..HIGH with LOW <= HIGH "
                              f"(e.g. \"0..999\"), got {value!r}")
        info = np.iinfo(by_name[target].dtype)
        if bounds[0] < info.min or bounds[1] > info.max:
            raise ConfigError(f"model {model!r}: parameters[{key!r}]: {value} does not fit {by_name[target].dtype}")
        by_name[target] = replace(by_name[target], valid_range=bounds)
    return tuple(by_name[t.name] for t in inputs)


def detect_runtime(path: Path) -> str:
    runtime = RUNTIME_BY_EXTENSION.get(Path(path).suffix)
    if runtime is None:
        raise ConfigError(
            f"cannot tell the runtime of {path.name} from its extension; set parameters "
            f"{{ key: \"runtime\" value: {{ string_value: \"...\" }} }} to one of {', '.join(RUNTIMES)}"
        )
    return runtime


def instance_count(config: Mapping) -> int:
    groups = config.get("instance_group") or [{"count": 1}]
    return sum(int(g.get("count", 1)) for g in groups)


def usable_core_ids() -> set:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def usable_cores() -> int:
    return len(usable_core_ids())


def parse_model_config(config: Mapping, model_dir: Path, version: str, device: str = "cpu") -> ModelSpec:
    """Check Triton's model config (as `initialize` receives it) and describe how to serve it."""
    name = config.get("name") or model_dir.name
    params = parameters_of(config)
    inputs = _with_valid_ranges(name, tuple(_tensor(t, "input") for t in config.get("input", [])), params)
    outputs = tuple(_tensor(t, "output") for t in config.get("output", []))
    if not inputs:
        raise ConfigError(f"model {name!r}: the config declares no input")
    if not outputs:
        raise ConfigError(f"model {name!r}: the config declares no output")
    max_batch_size = int(config.get("max_batch_size", 0))
    if max_batch_size < 0:
        raise ConfigError(f"model {name!r}: max_batch_size must be >= 0, got {max_batch_size}")
    if any(t.ragged for t in inputs) and max_batch_size == 0:
        raise ConfigError(f"model {name!r}: allow_ragged_batch needs max_batch_size > 0")

    model_file = params.get("model_file", "")
    version_dir = model_dir / str(version)
    if model_file:
        path = Path(model_file)
        model_path = path if path.is_absolute() else version_dir / path
    else:
        candidates = sorted(p for p in version_dir.iterdir() if p.suffix in RUNTIME_BY_EXTENSION) if version_dir.is_dir() else []
        if len(candidates) != 1:
            raise ConfigError(
                f"model {name!r}: set parameters[\"model_file\"]; found {len(candidates)} model files in {version_dir}"
            )
        model_path = candidates[0]
    if not model_path.exists():
        raise ConfigError(f"model {name!r}: model file {model_path} does not exist")
    runtime = params.get("runtime") or detect_runtime(model_path)
    if runtime not in RUNTIMES:
        raise ConfigError(f"model {name!r}: parameters[\"runtime\"] is {runtime!r}; expected one of {', '.join(RUNTIMES)}")

    intra = _int_param(params, "intra_op_threads", 1)
    inter = _int_param(params, "inter_op_threads", 1)
    count = instance_count(config)
    cores = usable_cores()
    try:
        pad_value = float(params.get("pad_value", "0") or 0)
    except ValueError:
        raise ConfigError(f"model {name!r}: parameters[\"pad_value\"] must be a number, got {params['pad_value']!r}") from None
    ragged = [t for t in inputs if t.ragged]
    max_len = _int_param(params, "max_sequence_length", None)
    edges_text = params.get("bucket_edges", "").strip()
    if edges_text.lower() == "none" or not ragged:
        bucket_edges = None
    elif edges_text:
        from latte.backend.buckets import BucketPlan

        try:
            bucket_edges = tuple(BucketPlan.parse(edges_text).edges)
        except ValueError as exc:
            raise ConfigError(f"model {name!r}: {exc}") from None
    else:
        from latte.backend.buckets import BucketPlan

        default = BucketPlan.default(max_len)
        bucket_edges = tuple(default.edges) if default else None
    session_input = params.get("session_input") or None
    if session_input is not None and session_input not in [t.name for t in ragged]:
        raise ConfigError(f"model {name!r}: parameters[\"session_input\"] is {session_input!r}; "
                          f"it must name a ragged input ({[t.name for t in ragged]})")
    try:
        ttl = float(params.get("session_ttl_s", "300") or 300)
    except ValueError:
        raise ConfigError(f"model {name!r}: parameters[\"session_ttl_s\"] must be a number of seconds") from None
    if ttl <= 0:
        raise ConfigError(f"model {name!r}: parameters[\"session_ttl_s\"] must be > 0")
    lanes = _int_param(params, "lanes", 1)
    if count * lanes * intra > cores:
        # Intra-op threads that outnumber free cores wait on each other for whole time
        # slices (measured: 14 us vs 32 ms per call); refuse rather than degrade.
        raise ConfigError(
            f"model {name!r}: {count} instance(s) x lanes={lanes} x intra_op_threads={intra} = "
            f"{count * lanes * intra} threads exceed the {cores} core(s) this server may use"
        )
    flags = {}
    for key, default in (("warmup", "true"), ("pin_lanes", "false"), ("reject_nan", "false"),
                         ("check_cancellation", "false"), ("pipeline", "false")):
        value = params.get(key, default).strip().lower()
        if value not in ("true", "false", "1", "0"):
            raise ConfigError(f"model {name!r}: parameters[\"{key}\"] must be true or false, got {value!r}")
        flags[key] = value in ("true", "1")
    scheduler = params.get("scheduler", "auto").strip().lower()
    if scheduler not in ("auto", "affinity", "inline"):
        raise ConfigError(f"model {name!r}: parameters[\"scheduler\"] must be auto, affinity or inline, got {scheduler!r}")
    try:
        batch_planning = parse_planning(params.get("batch_planning"))
    except ValueError as exc:
        raise ConfigError(f"model {name!r}: parameters[\"batch_planning\"]: {exc}") from None
    if flags["pipeline"] and scheduler == "inline":
        raise ConfigError(f"model {name!r}: parameters[\"pipeline\"] runs batches on scheduler lanes; "
                          f"it cannot be combined with scheduler: inline")
    if scheduler == "auto":
        # One lane gains nothing from placement, and handing batches to a lane thread costs
        # about 50 us per request (measured in-process on the example sequence model); a
        # pipelined model needs the lanes whatever their number.
        scheduler = "affinity" if lanes > 1 or flags["pipeline"] else "inline"
    if "max_queue_size" in params and scheduler == "inline":
        raise ConfigError(f"model {name!r}: parameters[\"max_queue_size\"] bounds the queue of the scheduler lanes, and this "
                          f"model runs inline, without one; set pipeline: true (or lanes > 1), or drop max_queue_size")
    respond = params.get("respond", "auto").strip().lower()
    if respond not in ("auto", "per_batch", "per_call"):
        raise ConfigError(f"model {name!r}: parameters[\"respond\"] must be auto, per_batch or per_call, got {respond!r}")
    return ModelSpec(
        name=name, inputs=inputs, outputs=outputs, max_batch_size=max_batch_size, runtime=runtime,
        model_path=model_path, intra_op_threads=intra, inter_op_threads=inter, instance_count=count,
        pad_value=pad_value, max_sequence_length=max_len,
        device=device, parameters=params, bucket_edges=bucket_edges, session_input=session_input,
        session_ttl_s=ttl, max_sessions=_int_param(params, "max_sessions", 10000),
        arena_bytes=_int_param(params, "arena_bytes", 64 << 20, minimum=1 << 16), lanes=lanes,
        warmup=flags["warmup"], pin_lanes=flags["pin_lanes"], reject_nan=flags["reject_nan"],
        check_cancellation=flags["check_cancellation"], scheduler=scheduler, respond=respond,
        batch_planning=batch_planning, pipeline=flags["pipeline"],
        batch_window_us=_int_param(params, "batch_window_us", 2000, minimum=0),
        max_queue_size=_int_param(params, "max_queue_size", 4096),
    )


def parse_args(args: Mapping) -> Tuple[Mapping, Path, str]:
    """The pieces of `initialize(args)` the backend needs: config dict, model dir, version."""
    config = json.loads(args["model_config"])
    return config, Path(args["model_repository"]), str(args.get("model_version", "1"))
