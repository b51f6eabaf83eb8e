"""The model config a latte model runs with, parsed and checked once at load.

Triton hands `initialize` the model config as JSON; this turns it into a `ModelSpec`, the
model's `ModelSignature` (tensors, max_batch_size, file and runtime) and the `ServingOptions`
its parameters choose, one small parser per section, and raises `ConfigError` (never
`assert`) with the offending key when it is wrong.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from latte.backend.buckets import BucketPlan
from latte.backend.dtypes import is_string, to_numpy
from latte.backend.errors import ConfigError
from latte.backend.planning import parse_planning

RUNTIMES = ("torchscript", "torch_export", "onnx", "tensorrt", "graph", "stream")
# A fused model's version folder: its graph of steps, and a folder of files per step.
GRAPH_FILE = "graph.json"
# A streaming model's version folder: its start and step graphs (docs/streaming.md).
STREAM_FILE = "stream.json"
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
class ModelSignature:
    """What the model is: its tensors, batching dimension and file, as Triton's config declares them."""
    name: str
    inputs: Tuple[TensorSpec, ...]
    outputs: Tuple[TensorSpec, ...]
    max_batch_size: int
    runtime: str
    model_path: Path

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


@dataclass(frozen=True)
class ThreadBudget:
    """The threads a model's instances compute on (instances x lanes x intra_op_threads) against
    the cores this server may use."""
    threads: int = 1
    cores: int = 1
    intra_op_threads: int = 1

    @property
    def oversubscribed(self) -> bool:
        return self.threads > self.cores

    @property
    def refused(self) -> bool:
        """Intra-op threads that outnumber free cores wait on each other for whole time slices
        (measured: 14 us vs 32 ms per call), so multi-threaded runtimes must fit the cores.
        Single-threaded instances beyond the cores are an ordinary CPU deployment (each
        instance is its own stub process and requests spend much of their life in IPC)."""
        return self.oversubscribed and self.intra_op_threads > 1

    @property
    def state(self) -> str:
        return "oversubscribed" if self.oversubscribed else "within"


@dataclass(frozen=True)
class ServingOptions:
    """How latte serves the model: the config's parameters, parsed. The defaults are those of a
    config that sets none of them."""
    device: str = "cpu"
    instance_count: int = 1
    intra_op_threads: int = 1
    inter_op_threads: int = 1
    lanes: int = 1
    thread_budget: ThreadBudget = ThreadBudget()
    precision: str = "fp32"
    freeze: bool = True                              # TorchScript frozen at load (torch.jit.freeze)
    accuracy_tolerance: float = 0.02                 # max relative L2 error of a reduced precision
    pad_value: float = 0.0
    max_sequence_length: Optional[int] = None
    bucket_edges: Optional[Tuple[int, ...]] = None   # for ragged inputs; None = pad to the batch's longest
    batch_planning: str = "cost"                     # "cost": cheapest plan across buckets; "bucket": one bucket per batch
    pad_to: str = "longest"                          # a batch of ragged requests pads to its "longest" member or its bucket's "edge"
    reject_nan: bool = False                         # refuse requests with NaN/inf in float inputs
    session_input: Optional[str] = None              # ragged input whose prefix a session keeps
    session_ttl_s: float = 300.0
    max_sessions: int = 10000
    arena_bytes: int = 64 << 20
    arena_pages: bool = True                         # a paged arena: physical pages under each block (docs/memory.md);
                                                     # a GPU instance's default is the plain one (_sessions)
    arena_pages_asked: bool = False                  # set in the config, not the default: a fallback is a warning
    warmup: bool = True
    scheduler: str = "inline"                        # "affinity" (scheduler lanes) or "inline"; see _scheduling
    pin_lanes: bool = False
    async_execute: bool = False                      # execute returns at once; lanes answer (see docs/backend.md)
    batch_window_us: int = 2000                      # longest an async_execute batch may wait to grow
    max_queue_size: int = 4096                       # requests the scheduler queues; past it the lowest priority is shed
    respond: str = "auto"                            # when early batches are answered (responses.EarlyAnswers)
    check_cancellation: bool = False                 # ask Triton per request whether the client gave up
    device_allocator: str = "caching"                # a GPU instance's torch memory: caching, expandable or arena
    device_arena_bytes: int = 1 << 30                # the arena's capacity when device_allocator is arena


# What each parameter defaults to: the parsers read their defaults here.
DEFAULTS = ServingOptions()


@dataclass(frozen=True)
class ModelSpec:
    signature: ModelSignature
    serving: ServingOptions = DEFAULTS


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


# The page of a model's paged arena (arena_pages): its size and the least arena_bytes then.
ARENA_PAGE_BYTES = 1 << 20


def _bool_param(name: str, params: Mapping[str, str], key: str, default: bool) -> bool:
    value = params.get(key, "true" if default else "false").strip().lower()
    if value not in ("true", "false", "1", "0"):
        raise ConfigError(f"model {name!r}: parameters[\"{key}\"] must be true or false, got {value!r}")
    return value in ("true", "1")


def _float_param(name: str, params: Mapping[str, str], key: str, default: float, what: str = "a number") -> float:
    raw = params.get(key, "")
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ConfigError(f"model {name!r}: parameters[\"{key}\"] must be {what}, got {raw!r}") from None


def _choice_param(name: str, params: Mapping[str, str], key: str, choices: Tuple[str, ...]) -> str:
    """The parameter's value, lower-cased, one of `choices`; the first choice is the default."""
    value = params.get(key, choices[0]).strip().lower() or choices[0]
    if value not in choices:
        raise ConfigError(f"model {name!r}: parameters[\"{key}\"] must be {', '.join(choices[:-1])} or "
                          f"{choices[-1]}, got {value!r}")
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
    if entry.get("allow_ragged_batch") and is_string(dtype):
        raise ConfigError(f"{where} {name!r}: strings are not padded into a batch; declare TYPE_STRING "
                          "inputs without allow_ragged_batch")
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
    if Path(path).name == GRAPH_FILE:
        return "graph"
    if Path(path).name == STREAM_FILE:
        return "stream"
    runtime = RUNTIME_BY_EXTENSION.get(Path(path).suffix)
    if runtime is None:
        raise ConfigError(
            f"cannot tell the runtime of {path.name} from its extension; set parameters "
            f"{{ key: \"runtime\" value: {{ string_value: \"...\" }} }} to one of {', '.join(RUNTIMES)}"
        )
    return runtime


def model_files_in(version_dir: Path) -> List[Path]:
    """The files of a version folder whose extension names a runtime, its graph of steps, or its
    streaming model."""
    if not version_dir.is_dir():
        return []
    return sorted(p for p in version_dir.iterdir()
                  if p.suffix in RUNTIME_BY_EXTENSION or p.name in (GRAPH_FILE, STREAM_FILE))


def find_model_file(version_dir: Path, params: Mapping[str, str]) -> Optional[Path]:
    """parameters["model_file"] (relative to the version folder unless absolute), else the
    folder's only model file; None when the folder holds none or several."""
    if params.get("model_file"):
        path = Path(params["model_file"])
        return path if path.is_absolute() else version_dir / path
    candidates = model_files_in(version_dir)
    return candidates[0] if len(candidates) == 1 else None


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


def cpu_model() -> str:
    """The CPU's model name as Linux reports it ("" where it does not)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def parse_tensors(config: Mapping) -> Tuple[Tuple[TensorSpec, ...], Tuple[TensorSpec, ...]]:
    """The inputs and outputs a model config declares, checked."""
    return (tuple(_tensor(t, "input") for t in config.get("input", [])),
            tuple(_tensor(t, "output") for t in config.get("output", [])))


def parse_signature(config: Mapping, params: Mapping[str, str], model_dir: Path, version: str) -> ModelSignature:
    """The model's tensors, max_batch_size and file; the parameters add valid ranges, the file and runtime."""
    name = config.get("name") or model_dir.name
    inputs, outputs = parse_tensors(config)
    inputs = _with_valid_ranges(name, inputs, params)
    if not inputs:
        raise ConfigError(f"model {name!r}: the config declares no input")
    if not outputs:
        raise ConfigError(f"model {name!r}: the config declares no output")
    max_batch_size = int(config.get("max_batch_size", 0))
    if max_batch_size < 0:
        raise ConfigError(f"model {name!r}: max_batch_size must be >= 0, got {max_batch_size}")
    if any(t.ragged for t in inputs) and max_batch_size == 0:
        raise ConfigError(f"model {name!r}: allow_ragged_batch needs max_batch_size > 0")
    version_dir = model_dir / str(version)
    model_path = find_model_file(version_dir, params)
    if model_path is None:
        raise ConfigError(f"model {name!r}: set parameters[\"model_file\"]; found "
                          f"{len(model_files_in(version_dir))} model files in {version_dir}")
    if not model_path.exists():
        raise ConfigError(f"model {name!r}: model file {model_path} does not exist")
    runtime = params.get("runtime") or detect_runtime(model_path)
    if runtime not in RUNTIMES:
        raise ConfigError(f"model {name!r}: parameters[\"runtime\"] is {runtime!r}; expected one of {', '.join(RUNTIMES)}")
    return ModelSignature(name=name, inputs=inputs, outputs=outputs, max_batch_size=max_batch_size,
                          runtime=runtime, model_path=model_path)


def _threads(name: str, params: Mapping[str, str], count: int) -> Dict:
    intra = _int_param(params, "intra_op_threads", DEFAULTS.intra_op_threads)
    lanes = _int_param(params, "lanes", DEFAULTS.lanes)
    budget = ThreadBudget(threads=count * lanes * intra, cores=usable_cores(), intra_op_threads=intra)
    if budget.refused:
        raise ConfigError(
            f"model {name!r}: {count} instance(s) x lanes={lanes} x intra_op_threads={intra} = "
            f"{budget.threads} threads exceed the {budget.cores} core(s) this server may use; "
            f"multi-threaded instances must fit the cores (set intra_op_threads to 1 to run more instances than cores)"
        )
    return {"instance_count": count, "intra_op_threads": intra, "lanes": lanes, "thread_budget": budget,
            "inter_op_threads": _int_param(params, "inter_op_threads", DEFAULTS.inter_op_threads)}


def thread_budget_warning(spec: ModelSpec) -> Optional[str]:
    """The log line for a model whose single-threaded instances outnumber the cores; None when they fit."""
    serving, budget = spec.serving, spec.serving.thread_budget
    if not budget.oversubscribed:
        return None
    return (f"model {spec.signature.name!r}: {serving.instance_count} instance(s) x lanes={serving.lanes} x "
            f"intra_op_threads={serving.intra_op_threads} = {budget.threads} threads on {budget.cores} core(s); "
            f"they take turns on the cores, so each call may wait for another's time slice")


PRECISIONS = ("fp32", "int8", "fp16")


def _precision(name: str, params: Mapping[str, str], runtime: str, device: str) -> Dict:
    """parameters precision (fp32 | int8 | fp16) and accuracy_tolerance; see backend/precision.py."""
    value = params.get("precision", "").strip().lower() or DEFAULTS.precision
    if value not in PRECISIONS:
        raise ConfigError(f"model {name!r}: parameters[\"precision\"] is {value!r}; expected one of {PRECISIONS}")
    if value == "int8" and runtime != "onnx":
        raise ConfigError(f"model {name!r}: precision int8 is available for ONNX models (this one is {runtime})")
    if value == "fp16" and (runtime not in ("torchscript", "torch_export") or not device.startswith("cuda")):
        raise ConfigError(f"model {name!r}: precision fp16 needs a torch model on a GPU instance (KIND_GPU)")
    if value == DEFAULTS.precision:
        return {"precision": value}
    tolerance = _float_param(name, params, "accuracy_tolerance", DEFAULTS.accuracy_tolerance)
    if tolerance <= 0:
        raise ConfigError(f"model {name!r}: parameters[\"accuracy_tolerance\"] must be > 0")
    return {"precision": value, "accuracy_tolerance": tolerance}


DEVICE_ALLOCATORS = ("caching", "expandable", "arena")


def _device_memory(name: str, params: Mapping[str, str], runtime: str, device: str) -> Dict:
    """parameters device_allocator and device_arena_bytes; see backend/device_memory.py."""
    allocator = _choice_param(name, params, "device_allocator", DEVICE_ALLOCATORS)
    if allocator != DEFAULTS.device_allocator and not device.startswith("cuda"):
        raise ConfigError(f"model {name!r}: parameters[\"device_allocator\"] is {allocator!r}, which chooses how torch "
                          f"holds GPU memory; this instance runs on the CPU (set instance_group kind: KIND_GPU)")
    if allocator != DEFAULTS.device_allocator and runtime not in ("torchscript", "torch_export", "graph"):
        raise ConfigError(f"model {name!r}: parameters[\"device_allocator\"] applies to torch models (this one is {runtime})")
    if "device_arena_bytes" in params and allocator != "arena":
        raise ConfigError(f"model {name!r}: parameters[\"device_arena_bytes\"] sizes the arena of device_allocator: "
                          f"arena, and this model's device_allocator is {allocator!r}")
    return {"device_allocator": allocator,
            "device_arena_bytes": _int_param(params, "device_arena_bytes", DEFAULTS.device_arena_bytes, minimum=1 << 20)}


def _batching(name: str, params: Mapping[str, str], signature: ModelSignature) -> Dict:
    max_len = _int_param(params, "max_sequence_length", DEFAULTS.max_sequence_length)
    edges_text = params.get("bucket_edges", "").strip()
    if edges_text.lower() == "none" or not signature.ragged_inputs:
        bucket_edges = None
    elif edges_text:
        try:
            bucket_edges = tuple(BucketPlan.parse(edges_text).edges)
        except ValueError as exc:
            raise ConfigError(f"model {name!r}: {exc}") from None
    else:
        default = BucketPlan.default(max_len)
        bucket_edges = tuple(default.edges) if default else None
    try:
        batch_planning = parse_planning(params.get("batch_planning"))
    except ValueError as exc:
        raise ConfigError(f"model {name!r}: parameters[\"batch_planning\"]: {exc}") from None
    # Runtimes that take any length serve more padded to a batch's longest member than to its
    # bucket's edge (1.07-1.08x rows/s, onnxruntime, the sequence encoder: docs/benchmarks.md,
    # "Batch planning"); TensorRT engines are built for shape profiles, so there the edge stays.
    pad_to = _choice_param(name, params, "pad_to", ("edge", "longest") if signature.runtime == "tensorrt"
                           else ("longest", "edge"))
    return {"pad_value": _float_param(name, params, "pad_value", DEFAULTS.pad_value), "max_sequence_length": max_len,
            "bucket_edges": bucket_edges, "batch_planning": batch_planning, "pad_to": pad_to,
            "reject_nan": _bool_param(name, params, "reject_nan", DEFAULTS.reject_nan)}


def _sessions(name: str, params: Mapping[str, str], signature: ModelSignature, device: str) -> Dict:
    ragged = [t.name for t in signature.inputs if t.ragged]
    session_input = params.get("session_input") or None
    if session_input is not None and session_input not in ragged:
        raise ConfigError(f"model {name!r}: parameters[\"session_input\"] is {session_input!r}; "
                          f"it must name a ragged input ({ragged})")
    ttl = _float_param(name, params, "session_ttl_s", DEFAULTS.session_ttl_s, what="a number of seconds")
    if ttl <= 0:
        raise ConfigError(f"model {name!r}: parameters[\"session_ttl_s\"] must be > 0")
    arena_bytes = _int_param(params, "arena_bytes", DEFAULTS.arena_bytes, minimum=1 << 16)
    # Paged by default where the arena holds a page and the instance runs on the CPU: a batch then
    # fails only when its pages are not there, and the arena holds the pages it touched. A GPU
    # instance keeps the plain arena, which is page-locked for its copies to the device.
    paged_by_default = arena_bytes >= ARENA_PAGE_BYTES and not device.startswith("cuda")
    arena_pages = _bool_param(name, params, "arena_pages", paged_by_default)
    if arena_pages and arena_bytes < ARENA_PAGE_BYTES:
        raise ConfigError(f"model {name!r}: parameters[\"arena_bytes\"] is {arena_bytes}; a paged arena "
                          f"(arena_pages) needs at least one page of {ARENA_PAGE_BYTES} bytes")
    return {"session_input": session_input, "session_ttl_s": ttl,
            "max_sessions": _int_param(params, "max_sessions", DEFAULTS.max_sessions),
            "arena_bytes": arena_bytes, "arena_pages": arena_pages, "arena_pages_asked": "arena_pages" in params}


def _scheduling(name: str, params: Mapping[str, str], lanes: int) -> Dict:
    if "pipeline" in params:
        raise ConfigError(f"model {name!r}: parameters[\"pipeline\"] is now called async_execute (execute returns at "
                          "once and the scheduler's lanes answer through response senders); rename it")
    async_execute = _bool_param(name, params, "async_execute", DEFAULTS.async_execute)
    scheduler = _choice_param(name, params, "scheduler", ("auto", "affinity", "inline"))
    if async_execute and scheduler == "inline":
        raise ConfigError(f"model {name!r}: parameters[\"async_execute\"] runs batches on scheduler lanes; "
                          f"it cannot be combined with scheduler: inline")
    if scheduler == "auto":
        # One lane gains nothing from placement, and handing batches to a lane thread costs
        # about 50 us per request (measured in-process on the example sequence model); a
        # model with async_execute needs the lanes whatever their number.
        scheduler = "affinity" if lanes > 1 or async_execute else "inline"
    if "max_queue_size" in params and scheduler == "inline":
        raise ConfigError(f"model {name!r}: parameters[\"max_queue_size\"] bounds the queue of the scheduler lanes, and this "
                          f"model runs inline, without one; set async_execute: true (or lanes > 1), or drop max_queue_size")
    return {"scheduler": scheduler, "async_execute": async_execute,
            "pin_lanes": _bool_param(name, params, "pin_lanes", DEFAULTS.pin_lanes),
            "batch_window_us": _int_param(params, "batch_window_us", DEFAULTS.batch_window_us, minimum=0),
            "max_queue_size": _int_param(params, "max_queue_size", DEFAULTS.max_queue_size),
            "respond": _choice_param(name, params, "respond", ("auto", "per_batch", "per_call")),
            "check_cancellation": _bool_param(name, params, "check_cancellation", DEFAULTS.check_cancellation),
            "warmup": _bool_param(name, params, "warmup", DEFAULTS.warmup)}


def parse_model_config(config: Mapping, model_dir: Path, version: str, device: str = "cpu") -> ModelSpec:
    """Check Triton's model config (as `initialize` receives it) and describe how to serve it."""
    params = parameters_of(config)
    signature = parse_signature(config, params, model_dir, version)
    name = signature.name
    threads = _threads(name, params, instance_count(config))
    serving = ServingOptions(device=device, **threads, **_precision(name, params, signature.runtime, device),
                             freeze=_bool_param(name, params, "freeze", DEFAULTS.freeze),
                             **_batching(name, params, signature), **_sessions(name, params, signature, device),
                             **_scheduling(name, params, threads["lanes"]),
                             **_device_memory(name, params, signature.runtime, device))
    return ModelSpec(signature, serving)


def parse_args(args: Mapping) -> Tuple[Mapping, Path, str]:
    """The pieces of `initialize(args)` the backend needs: config dict, model dir, version."""
    config = json.loads(args["model_config"])
    return config, Path(args["model_repository"]), str(args.get("model_version", "1"))
