"""The pipeline spec `latte generate` reads: models, their SLOs, and ensembles wiring them.

    resources: {cores: 2, gpus: 0}          # optional; default: this machine's cores, no GPU
    models:
      - name: tokenize                      # a small step written by the user as model.py
        file: tokenize.py
        backend: python                     # implied by the .py extension
        function: tokenize                  # optional: a function on batch arrays a fused model calls
        max_batch_size: 8
        inputs:  [{name: TEXT, data_type: TYPE_STRING, dims: [1]}]
        outputs: [{name: TOKENS, data_type: TYPE_INT64, dims: [-1]}]
      - name: encoder                       # served by latte; settings derived from its profile
        file: models/sequence.onnx
        slo_ms: 50
        arrival_rate: 200                   # optional, requests/s
        priority_levels: 2                  # optional; clients send the parameter priority_level 0 or 1
        priority_queue: latte               # optional; whose queue holds them: latte (default) or triton
        health_rss_growth_mib_per_min: 8    # optional; latte serve reloads the model when its RSS grows faster
        profile: profiles/encoder.json      # optional; profiled during generate when absent
        overrides: {max_batch_size: 8}      # optional; wins over the derived values
        versions:                           # optional, instead of `file`: one file per version folder
          - {version: 1, file: models/sequence.onnx}
          - {version: 2, file: models/sequence_v2.onnx}
        version_policy: {latest: 2}         # optional; Triton's: {latest: N}, {specific: [1, 2]} or all
        response_cache: true                # optional; Triton answers repeated requests from its cache
      - name: textgen                       # a streaming model (docs/streaming.md), decoupled
        stream: textgen/1/stream.json       # its stream.json; the files beside it go with it
        ttft_ms: 200                        # P99 time to first token
        inter_token_ms: 50                  # P99 time between tokens
        max_tokens: 32                      # optional: outputs a request asks for (default 16)
        arrival_rate: 20                    # optional, streams/s
        profile: profiles/textgen.json      # optional; profiled during generate when absent
        overrides: {parameters: {max_waiting: 256}}   # optional
    ensembles:
      - name: embed_text
        samples: texts.json                 # optional; requests to check a fused model with at load
        slo_ms: 50                          # optional; end to end, default: the tightest latte step's
        profile: profiles/embed_text.json   # optional; the fused model's, profiled during generate when absent
        inputs:  [{name: TEXT, data_type: TYPE_STRING, dims: [1]}]
        outputs: [{name: EMBEDDING, data_type: TYPE_FP32, dims: [32]}]
        steps:
          - {model: tokenize, inputs: {TEXT: TEXT}, outputs: {TOKENS: tokens}}
          - {model: encoder, inputs: {tokens: tokens}, outputs: {embedding: EMBEDDING}}

Step `inputs` map the model's input name to an ensemble tensor, `outputs` the model's
output name to an ensemble tensor, as Triton's input_map / output_map do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

# The backend's own tables: a file the generator accepts is one the backend can serve.
from latte.backend.config import RUNTIME_BY_EXTENSION, RUNTIMES, usable_cores
from latte.backend.dtypes import TRITON_TYPES
from latte.backend.streaming.options import DEFAULTS as STREAM_DEFAULTS
# A step of a spec is the wiring the DAG check verifies, so both use one type.
from latte.generator.dag import StepWiring as Step
from latte.generator.derive import DEFAULT_PRIORITY_QUEUE, PRIORITY_QUEUES
from latte.generator.fuse import python_definitions
from latte.generator.yaml_lines import KeyPath, Located, SpecError, load

BACKENDS = ("latte", "python")
PYTHON_DEFAULT_MAX_BATCH = 16
MODEL_KEYS = {"name", "file", "function", "backend", "runtime", "slo_ms", "arrival_rate", "priority_levels", "priority_queue", "profile",
              "overrides", "inputs", "outputs", "max_batch_size", "instance_count", "intra_op_threads",
              "backend_overhead_ms", "versions", "version_policy", "response_cache", "health_rss_growth_mib_per_min"}
STREAM_MODEL_KEYS = {"name", "stream", "ttft_ms", "inter_token_ms", "max_tokens", "arrival_rate", "profile",
                     "intra_op_threads", "overrides"}
VERSION_KEYS = {"version", "file"}
# Triton's ModelVersionPolicy: `all`, `latest: N` or `specific: [versions]`.
VERSION_POLICIES = ("all", "latest", "specific")
OVERRIDE_KEYS = {"max_batch_size", "dynamic_batching", "instance_count", "instance_kind", "parameters"}
ENSEMBLE_KEYS = {"name", "max_batch_size", "inputs", "outputs", "steps", "samples", "slo_ms", "profile"}
STEP_KEYS = {"model", "inputs", "outputs"}


@dataclass
class Tensor:
    name: str
    data_type: str
    dims: List[int]
    ragged: bool = False
    optional: bool = False

    def context(self) -> dict:
        return {"name": self.name, "data_type": self.data_type, "dims": list(self.dims),
                "allow_ragged_batch": self.ragged, "optional": self.optional}


@dataclass
class ModelEntry:
    name: str
    backend: str
    file: Path
    path: KeyPath                        # where the entry sits in the spec, for error messages
    runtime: Optional[str] = None
    slo_ms: Optional[float] = None
    arrival_rate: Optional[float] = None
    priority_levels: int = 0
    priority_queue: str = DEFAULT_PRIORITY_QUEUE   # whose queue holds the priority levels
    profile: Optional[Path] = None
    overrides: Dict[str, Any] = field(default_factory=dict)
    inputs: Optional[List[Tensor]] = None
    outputs: Optional[List[Tensor]] = None
    max_batch_size: Optional[int] = None
    instance_count: int = 1
    intra_op_threads: int = 1
    backend_overhead_ms: Optional[float] = None
    # version number -> file; `file` is the newest one (profiled, and the one a single version serves).
    versions: Dict[int, Path] = field(default_factory=dict)
    version_policy: Optional[Dict[str, Any]] = None   # {"all": {}}, {"latest": N} or {"specific": [..]}
    response_cache: bool = False
    function: Optional[str] = None       # python models: a plain function on batch arrays a fused model calls
    health_rss_growth_mib_per_min: Optional[float] = None   # latte models: RSS growth that gets them reloaded
    stream: Optional["StreamSLO"] = None  # a streaming model: its SLOs (file is its stream.json)


@dataclass(frozen=True)
class StreamSLO:
    ttft_ms: float                       # P99 time to first token
    inter_token_ms: float                # P99 time between tokens
    max_tokens: int = STREAM_DEFAULTS.max_tokens   # outputs a request asks for (the config's default)


@dataclass
class EnsembleEntry:
    name: str
    path: KeyPath
    inputs: List[Tensor]
    outputs: List[Tensor]
    steps: List[Step]
    max_batch_size: Optional[int] = None
    # requests its first steps accept (perf_analyzer --input-data JSON): a fused model checks its
    # steps' tensors on them at load, where made-up values would not parse
    samples: Optional[Path] = None
    slo_ms: Optional[float] = None       # end to end; default: the tightest of its latte steps'
    profile: Optional[Path] = None       # the fused model's; profiled during generate when absent


@dataclass
class PipelineSpec:
    source: Located
    directory: Path
    models: List[ModelEntry]
    ensembles: List[EnsembleEntry]
    cores: int
    gpus: int

    def model(self, name: str) -> Optional[ModelEntry]:
        return next((m for m in self.models if m.name == name), None)


class _Reader:
    """Typed access to the loaded YAML that raises SpecError at the right line."""

    def __init__(self, doc: Located) -> None:
        self.doc = doc

    def get(self, path: KeyPath) -> Any:
        value = self.doc.value
        for part in path:
            value = value[part]
        return value

    def mapping(self, path: KeyPath, keys: Optional[set] = None) -> dict:
        value = self.get(path)
        if not isinstance(value, dict):
            raise self.doc.error(path, f"expected a mapping, got {type(value).__name__}")
        if keys is not None:
            unknown = sorted(set(value) - keys, key=str)
            if unknown:
                raise self.doc.error(path + (unknown[0],), f"unknown key; expected one of {', '.join(sorted(keys))}")
        return value

    def sequence(self, path: KeyPath) -> list:
        value = self.get(path)
        if not isinstance(value, list):
            raise self.doc.error(path, f"expected a list, got {type(value).__name__}")
        return value

    def string(self, path: KeyPath) -> str:
        value = self.get(path)
        if not isinstance(value, str) or not value:
            raise self.doc.error(path, f"expected a non-empty string, got {value!r}")
        return value

    def number(self, path: KeyPath, integer: bool = False, minimum: float = 0) -> float:
        value = self.get(path)
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or value < minimum:
            kind = "an integer" if integer else "a number"
            raise self.doc.error(path, f"expected {kind} >= {minimum}, got {value!r}")
        return value

    def optional(self, mapping: dict, path: KeyPath, key: str, kind, **kw):
        return kind(path + (key,), **kw) if key in mapping else None

    def tensors(self, path: KeyPath) -> List[Tensor]:
        out = []
        for i, _ in enumerate(self.sequence(path)):
            here = path + (i,)
            entry = self.mapping(here, {"name", "data_type", "dims", "ragged", "optional"})
            for key in ("name", "data_type", "dims"):
                if key not in entry:
                    raise self.doc.error(here + (key,), "missing; every tensor needs name, data_type and dims")
            data_type = self.string(here + ("data_type",))
            if not data_type.startswith("TYPE_"):
                data_type = "TYPE_" + data_type
            if data_type not in TRITON_TYPES:
                raise self.doc.error(here + ("data_type",), f"unknown data type {entry['data_type']!r}; expected "
                                     f"one of {', '.join(TRITON_TYPES)}")
            dims = self.sequence(here + ("dims",))
            if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d == 0 or d < -1 for d in dims):
                raise self.doc.error(here + ("dims",), f"dims must be a non-empty list of positive integers or -1, "
                                     f"got {dims!r}")
            name = self.string(here + ("name",))
            if any(t.name == name for t in out):
                raise self.doc.error(here + ("name",), f"tensor {name!r} is declared twice")
            out.append(Tensor(name, data_type, list(dims), bool(entry.get("ragged", False)),
                              bool(entry.get("optional", False))))
        return out

    def tensor_map(self, path: KeyPath) -> Dict[str, str]:
        mapping = self.mapping(path)
        for key, value in mapping.items():
            if not isinstance(value, str) or not value:
                raise self.doc.error(path + (key,), f"expected an ensemble tensor name, got {value!r}")
        return dict(mapping)


def _stream_model(reader: _Reader, directory: Path, path: KeyPath) -> ModelEntry:
    """A streaming model: its stream.json, checked as the backend loads it, and its two SLOs."""
    from latte.backend.errors import ConfigError
    from latte.backend.streaming.definition import load_stream

    doc = reader.doc
    raw = reader.mapping(path, STREAM_MODEL_KEYS)
    for key in ("name", "ttft_ms", "inter_token_ms"):
        if key not in raw:
            raise doc.error(path + (key,), "missing; a streaming model needs name, stream, ttft_ms (P99 time to "
                            "first token) and inter_token_ms (P99 time between tokens)")
    file = directory / reader.string(path + ("stream",))
    if not file.is_file():
        raise doc.error(path + ("stream",), f"file {file} does not exist")
    try:
        load_stream(file)
    except ConfigError as exc:
        raise doc.error(path + ("stream",), str(exc)) from None
    slo = StreamSLO(ttft_ms=float(reader.number(path + ("ttft_ms",), minimum=0.001)),
                    inter_token_ms=float(reader.number(path + ("inter_token_ms",), minimum=0.001)),
                    max_tokens=int(reader.optional(raw, path, "max_tokens", reader.number, integer=True, minimum=1)
                                   or STREAM_DEFAULTS.max_tokens))
    entry = ModelEntry(name=reader.string(path + ("name",)), backend="latte", file=file, path=path, runtime="stream",
                       stream=slo)
    rate = reader.optional(raw, path, "arrival_rate", reader.number, minimum=0.001)
    entry.arrival_rate = float(rate) if rate is not None else None
    entry.intra_op_threads, entry.profile = _threads_and_profile(reader, raw, path, directory, file)
    if "overrides" in raw:
        entry.overrides = dict(reader.mapping(path + ("overrides",), {"parameters"}))
    return entry


def _threads_and_profile(reader: _Reader, raw: dict, path: KeyPath, directory: Path, file: Path):
    """A latte model's intra_op_threads (default 1) and its profile's path, which must exist."""
    threads = reader.optional(raw, path, "intra_op_threads", reader.number, integer=True, minimum=1) or 1
    profile = None
    if "profile" in raw:
        profile = directory / reader.string(path + ("profile",))
        if not profile.exists():
            raise reader.doc.error(path + ("profile",), f"profile {profile} does not exist; run `latte profile "
                                   f"{file}` or drop the key to profile during generate")
    return int(threads), profile


def _model(reader: _Reader, directory: Path, path: KeyPath) -> ModelEntry:
    doc = reader.doc
    if isinstance(reader.get(path), dict) and "stream" in reader.get(path):
        return _stream_model(reader, directory, path)
    raw = reader.mapping(path, MODEL_KEYS)
    if "name" not in raw:
        raise doc.error(path + ("name",), "missing; every model needs a name")
    if ("file" in raw) == ("versions" in raw):
        raise doc.error(path + ("file",), "every model needs either a file or a list of versions (not both)")
    name = reader.string(path + ("name",))
    versions = _versions(reader, directory, path) if "versions" in raw else {}
    file = versions[max(versions)] if versions else directory / reader.string(path + ("file",))
    if not file.exists():
        raise doc.error(path + ("file",), f"file {file} does not exist")
    backend = raw.get("backend") or ("python" if file.suffix == ".py" else "latte")
    if backend not in BACKENDS:
        raise doc.error(path + ("backend",), f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    entry = ModelEntry(name=name, backend=backend, file=file, path=path, versions=versions,
                       version_policy=_version_policy(reader, path, versions) if "version_policy" in raw else None,
                       response_cache=_flag(reader, path + ("response_cache",)) if "response_cache" in raw else False)
    entry.inputs = reader.tensors(path + ("inputs",)) if "inputs" in raw else None
    entry.outputs = reader.tensors(path + ("outputs",)) if "outputs" in raw else None
    entry.max_batch_size = reader.optional(raw, path, "max_batch_size", reader.number, integer=True)
    entry.instance_count = reader.optional(raw, path, "instance_count", reader.number, integer=True, minimum=1) or 1
    if backend == "python":
        if file.suffix != ".py":
            raise doc.error(path + ("file",), "a python-backend model is a model.py source file (*.py)")
        for key in ("inputs", "outputs"):
            if key not in raw:
                raise doc.error(path + (key,), "missing; a python model declares its inputs and outputs")
        for key in ("slo_ms", "profile", "runtime", "arrival_rate", "overrides", "backend_overhead_ms", "priority_queue",
                    "health_rss_growth_mib_per_min"):
            if key in raw:
                raise doc.error(path + (key,), "only latte models are profiled and derived; remove it")
        if entry.max_batch_size is None:
            entry.max_batch_size = PYTHON_DEFAULT_MAX_BATCH
        if "function" in raw:
            entry.function = reader.string(path + ("function",))
            if entry.function not in python_definitions(file):
                raise doc.error(path + ("function",), f"{file.name} defines no function {entry.function!r}")
        return entry
    if "function" in raw:
        raise doc.error(path + ("function",), "names a function of a python model's file; a latte model has none")

    entry.runtime = raw.get("runtime") or RUNTIME_BY_EXTENSION.get(file.suffix)
    if entry.runtime not in RUNTIMES:
        raise doc.error(path + ("runtime",), f"cannot serve {file.name} with runtime {entry.runtime!r}; set runtime "
                        f"to one of {', '.join(sorted(RUNTIMES))}")
    if "slo_ms" not in raw:
        raise doc.error(path + ("slo_ms",), "missing; a latte model needs its P99 latency SLO in milliseconds")
    entry.slo_ms = float(reader.number(path + ("slo_ms",), minimum=0.001))
    rate = reader.optional(raw, path, "arrival_rate", reader.number, minimum=0.001)
    entry.arrival_rate = float(rate) if rate is not None else None
    entry.priority_levels = reader.optional(raw, path, "priority_levels", reader.number, integer=True) or 0
    if "priority_queue" in raw:
        queue = reader.string(path + ("priority_queue",))
        if queue not in PRIORITY_QUEUES:
            raise doc.error(path + ("priority_queue",), f"expected one of {', '.join(PRIORITY_QUEUES)}, got {queue!r}")
        if entry.priority_levels < 2:
            raise doc.error(path + ("priority_queue",), "says whose queue holds priority_levels; set "
                            "priority_levels: 2 or more, or remove it")
        entry.priority_queue = queue
    entry.intra_op_threads, entry.profile = _threads_and_profile(reader, raw, path, directory, file)
    overhead = reader.optional(raw, path, "backend_overhead_ms", reader.number)
    entry.backend_overhead_ms = float(overhead) if overhead is not None else None
    growth = reader.optional(raw, path, "health_rss_growth_mib_per_min", reader.number, minimum=0.001)
    entry.health_rss_growth_mib_per_min = float(growth) if growth is not None else None
    if "overrides" in raw:
        entry.overrides = dict(reader.mapping(path + ("overrides",), OVERRIDE_KEYS))
    return entry


def _flag(reader: _Reader, path: KeyPath) -> bool:
    value = reader.get(path)
    if not isinstance(value, bool):
        raise reader.doc.error(path, f"expected true or false, got {value!r}")
    return value


def _versions(reader: _Reader, directory: Path, path: KeyPath) -> Dict[int, Path]:
    """`versions: [{version: N, file: F}, ...]`: every file exists, with one extension (one config serves all)."""
    doc = reader.doc
    versions: Dict[int, Path] = {}
    entries = reader.sequence(path + ("versions",))
    if not entries:
        raise doc.error(path + ("versions",), "list at least one version")
    for i, _ in enumerate(entries):
        here = path + ("versions", i)
        entry = reader.mapping(here, VERSION_KEYS)
        for key in ("version", "file"):
            if key not in entry:
                raise doc.error(here + (key,), "missing; a version needs its number and its file")
        number = int(reader.number(here + ("version",), integer=True, minimum=1))
        if number in versions:
            raise doc.error(here + ("version",), f"version {number} is listed twice")
        file = directory / reader.string(here + ("file",))
        if not file.exists():
            raise doc.error(here + ("file",), f"file {file} does not exist")
        if versions and file.suffix != next(iter(versions.values())).suffix:
            raise doc.error(here + ("file",), f"{file.name} differs in extension from the other versions; one "
                            "config serves every version, so they share one runtime and file name")
        versions[number] = file
    return versions


def _version_policy(reader: _Reader, path: KeyPath, versions: Dict[int, Path]) -> Dict[str, Any]:
    """`all`, `{latest: N}` or `{specific: [N, ...]}`, the last naming listed versions only."""
    doc = reader.doc
    here = path + ("version_policy",)
    raw = reader.get(here)
    if raw == "all":
        return {"all": {}}
    expected = "expected all, {latest: N} or {specific: [N, ...]}"
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in VERSION_POLICIES:
        raise doc.error(here, f"{expected}, got {raw!r}")
    kind = next(iter(raw))
    if kind == "all":
        return {"all": {}}
    if kind == "latest":
        return {"latest": int(reader.number(here + ("latest",), integer=True, minimum=1))}
    numbers = reader.sequence(here + ("specific",))
    listed = sorted(versions) or [1]
    for i, _ in enumerate(numbers):
        number = reader.number(here + ("specific", i), integer=True, minimum=1)
        if number not in listed:
            raise doc.error(here + ("specific", i), f"version {number} is not among the model's versions "
                            f"({', '.join(map(str, listed))})")
    if not numbers:
        raise doc.error(here + ("specific",), f"{expected}; the list is empty")
    return {"specific": sorted(set(int(n) for n in numbers))}


def _ensemble(reader: _Reader, directory: Path, path: KeyPath) -> EnsembleEntry:
    doc = reader.doc
    raw = reader.mapping(path, ENSEMBLE_KEYS)
    for key in ("name", "inputs", "outputs", "steps"):
        if key not in raw:
            raise doc.error(path + (key,), f"missing; an ensemble needs name, inputs, outputs and steps")
    steps = []
    for i, _ in enumerate(reader.sequence(path + ("steps",))):
        here = path + ("steps", i)
        step = reader.mapping(here, STEP_KEYS)
        for key in STEP_KEYS:
            if key not in step:
                raise doc.error(here + (key,), "missing; a step needs model, inputs and outputs")
        steps.append(Step(reader.string(here + ("model",)), reader.tensor_map(here + ("inputs",)),
                          reader.tensor_map(here + ("outputs",))))
    if not steps:
        raise doc.error(path + ("steps",), "an ensemble needs at least one step")
    samples = None
    if "samples" in raw:
        samples = directory / reader.string(path + ("samples",))
        if not samples.is_file():
            raise doc.error(path + ("samples",), f"file {samples} does not exist")
    profile = None
    if "profile" in raw:
        profile = directory / reader.string(path + ("profile",))
        if not profile.is_file():
            raise doc.error(path + ("profile",), f"profile {profile} does not exist; drop the key to profile the "
                            "fused model during generate")
    slo = reader.optional(raw, path, "slo_ms", reader.number, minimum=0.001)
    return EnsembleEntry(name=reader.string(path + ("name",)), path=path,
                         inputs=reader.tensors(path + ("inputs",)), outputs=reader.tensors(path + ("outputs",)),
                         steps=steps,
                         max_batch_size=reader.optional(raw, path, "max_batch_size", reader.number, integer=True),
                         samples=samples, slo_ms=float(slo) if slo is not None else None, profile=profile)


def load_spec(spec_path: Path) -> PipelineSpec:
    """Read and check a pipeline spec; every error names the file, line and key."""
    doc = load(spec_path)
    reader = _Reader(doc)
    top = reader.mapping((), {"models", "ensembles", "resources"})
    if "models" not in top:
        raise doc.error(("models",), "missing; the spec lists its models under `models:`")
    directory = Path(spec_path).resolve().parent
    models = [_model(reader, directory, ("models", i)) for i, _ in enumerate(reader.sequence(("models",)))]
    names = set()
    for m in models:
        if m.name in names:
            raise doc.error(m.path + ("name",), f"model {m.name!r} is defined twice")
        names.add(m.name)
    ensembles = [_ensemble(reader, directory, ("ensembles", i)) for i, _ in enumerate(reader.sequence(("ensembles",)))] \
        if "ensembles" in top else []
    for e in ensembles:
        if e.name in names:
            raise doc.error(e.path + ("name",), f"name {e.name!r} is already used by another model or ensemble")
        names.add(e.name)
    resources = reader.mapping(("resources",), {"cores", "gpus"}) if "resources" in top else {}
    cores = int(reader.optional(resources, ("resources",), "cores", reader.number, integer=True, minimum=1)
                or usable_cores())
    gpus = int(reader.optional(resources, ("resources",), "gpus", reader.number, integer=True) or 0)
    return PipelineSpec(source=doc, directory=directory, models=models, ensembles=ensembles, cores=cores, gpus=gpus)
