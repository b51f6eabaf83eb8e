"""Fusing an ensemble: the steps latte can run in its own process become one `backend: "latte"`
model that runs them as a graph (latte.backend.graph), so no request hops through Triton's
core between them.

The analysis is the same for a pipeline spec (`latte generate`) and a hand-written repository
(`latte fuse`): each step is described as a `StepSource` (its config as the graph will load
it, its files, the device it computes on, or the reason latte cannot run it); connected sets
of steps that can run together on one device become groups; a group that covers the whole
ensemble takes the ensemble's name, so clients call what they called before; otherwise each
group is a model of its own and Triton's ensemble remains around the steps latte cannot run.
"""

from __future__ import annotations

import ast
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from latte.backend.config import GRAPH_FILE, RUNTIME_BY_EXTENSION
from latte.backend.graph.definition import GRAPH_FORMAT, STEP_VERSION
from latte.generator.dag import EnsembleWiring, Interface, TensorInfo

# Triton backends (and platforms) whose models latte runs as graph steps, and the runtime each
# one's file takes; python steps run as functions or as their TritonPythonModel.
MODEL_BACKENDS = {"onnxruntime": ("onnx", "model.onnx"), "pytorch": ("torchscript", "model.pt")}
PLATFORMS = {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch"}
DEFAULT_QUEUE_DELAY_US = 500
DEFAULT_MAX_BATCH_SIZE = 32


class FuseError(ValueError):
    """An ensemble that cannot be fused as asked; the message names the file (and line)."""


@dataclass
class StepSource:
    """One step model as a graph would run it."""
    model: str
    config: Dict                         # its model config as Triton's JSON, as the graph loads it
    files: Dict[str, Path]               # name inside the step's version folder -> source
    interface: Interface
    function: Optional[str] = None       # python steps: a plain function on batch arrays
    device: Optional[str] = None         # "cpu" or "gpu" for a model step; None: a python step, on the host
    reason: Optional[str] = None         # why latte cannot run it; None when it can
    instance_count: int = 1
    queue_delay_us: Optional[int] = None
    intra_op_threads: int = 1


@dataclass
class FusedModel:
    name: str
    steps: List[str]                     # step model names, in the ensemble's order
    context: Dict                        # config.pbtxt of the fused model
    graph: Dict                          # its graph.json
    files: Dict[str, Path]               # path inside the version folder -> source


@dataclass
class Fusion:
    """What became of one ensemble."""
    ensemble: str
    fused: List[FusedModel]
    unfused: Dict[str, str] = field(default_factory=dict)   # step model -> why it was not fused
    # The ensemble's steps around what did not fuse (the fused groups called as steps); None when
    # the ensemble stays as it was (nothing fused) or is replaced (`replaced`).
    steps: Optional[List[Dict]] = None

    @property
    def replaced(self) -> bool:
        """Whether one fused model runs the whole ensemble, under its name."""
        return len(self.fused) == 1 and self.fused[0].name == self.ensemble

    def summary(self) -> List[str]:
        lines = []
        for model in self.fused:
            where = ("replaces the ensemble" if model.name == self.ensemble
                     else f"a step of ensemble {self.ensemble!r}")
            lines.append(f"{self.ensemble}: fused {' -> '.join(model.steps)} into latte model {model.name!r} ({where})")
        for step, reason in self.unfused.items():
            lines.append(f"{self.ensemble}: step {step!r} not fused: {reason}")
        return lines


# -- reading a step ---------------------------------------------------------------------
def python_definitions(path: Path) -> Dict[str, int]:
    """Top-level functions and classes a Python file defines, with their lines."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    return {node.name: node.lineno for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def config_json(message) -> Dict:
    """A ModelConfig message as the JSON Triton hands a model (and the graph loads a step with)."""
    from google.protobuf.json_format import MessageToDict

    config = MessageToDict(message, preserving_proto_field_name=True)
    for key in ("input", "output"):  # protobuf's JSON writes int64 as strings; Triton's has numbers
        for tensor in config.get(key, []):
            tensor["dims"] = [int(d) for d in tensor.get("dims", [])]
    return config


def interface_from_json(config: Mapping) -> Interface:
    def tensors(key: str) -> Dict[str, TensorInfo]:
        return {t["name"]: TensorInfo(t.get("data_type", "TYPE_FP32"), tuple(int(d) for d in t.get("dims", [])))
                for t in config.get(key, [])}

    return Interface(name=config.get("name", ""), max_batch_size=int(config.get("max_batch_size", 0)),
                     inputs=tensors("input"), outputs=tensors("output"),
                     optional_inputs=tuple(t["name"] for t in config.get("input", []) if t.get("optional")))


def _plan_ragged(config: Dict) -> Dict:
    """A model step's config with every input of a variable dimension marked ragged: inside a
    graph a batch's rows differ in length, and the step pads and plans them by it."""
    config = json.loads(json.dumps(config))
    for tensor in config.get("input", []):
        if any(int(d) == -1 for d in tensor.get("dims", [])) and tensor.get("data_type") != "TYPE_STRING":
            tensor["allow_ragged_batch"] = True
    return config


def step_source(config_message, files: Mapping[str, Path], function: Optional[str] = None) -> StepSource:
    """A step model (a repository's, or one `latte generate` renders) as the graph would run it:
    its ModelConfig and the files of its version folder, by name."""
    config = config_json(config_message)
    name = config.get("name", "")
    backend = config.get("backend") or PLATFORMS.get(config.get("platform", ""), config.get("platform", ""))
    interface = interface_from_json(config)
    groups = config.get("instance_group") or [{}]
    device = "gpu" if any(g.get("kind") == "KIND_GPU" for g in groups) else "cpu"
    count = sum(int(g.get("count", 1)) for g in groups)
    # A field at its default (a queue delay of 0) is left out of the JSON.
    delay = (config["dynamic_batching"].get("max_queue_delay_microseconds", 0)
             if "dynamic_batching" in config else None)
    params = {k: (v.get("string_value", "") if isinstance(v, Mapping) else str(v))
              for k, v in (config.get("parameters") or {}).items()}
    source = StepSource(model=name, config=config, files={}, interface=interface, function=function, device=device,
                        instance_count=count, queue_delay_us=int(delay) if delay is not None else None,
                        intra_op_threads=int(params.get("intra_op_threads", "1") or 1))
    if config.get("sequence_batching") is not None:
        source.reason = "it keeps state between a sequence's requests (sequence_batching)"
    elif (config.get("model_transaction_policy") or {}).get("decoupled"):
        source.reason = "it is decoupled (it may send several responses per request)"
    elif int(config.get("max_batch_size", 0)) == 0:
        source.reason = "it does not batch (max_batch_size 0)"
    elif backend == "python":
        source.device = None
        if "EXECUTION_ENV_PATH" in params:
            source.reason = "it runs in a Python environment of its own (EXECUTION_ENV_PATH)"
        elif "model.py" not in files:
            source.reason = "its version folder has no model.py"
        else:
            defined = python_definitions(files["model.py"])
            if function is None and "TritonPythonModel" not in defined:
                source.reason = "its model.py defines no TritonPythonModel"
            source.files = dict(files)
    elif backend in MODEL_BACKENDS or backend == "latte":
        if backend == "latte":
            model_file = params.get("model_file") or next((name for name in sorted(files) if Path(name).suffix in
                                                           RUNTIME_BY_EXTENSION), "")
            runtime = params.get("runtime")
        else:
            runtime, default = MODEL_BACKENDS[backend]
            model_file = config.get("default_model_filename") or default
        if model_file not in files:
            source.reason = f"its version folder has no model file {model_file or '(none named)'}"
        elif runtime == "graph" or model_file == GRAPH_FILE:
            source.reason = "it is a fused model already"
        else:
            config = _plan_ragged(config)
            config["backend"] = "latte"
            config.pop("platform", None)
            config["parameters"] = {**(config.get("parameters") or {}), "model_file": {"string_value": model_file}}
            if runtime:
                config["parameters"]["runtime"] = {"string_value": runtime}
            source.config = config
            source.files = {model_file: files[model_file]}
    else:
        source.reason = f"backend {backend or '(none)'!r} runs outside latte"
    return source


# -- grouping -------------------------------------------------------------------------------
def _edges(wiring: EnsembleWiring) -> List[Tuple[int, int]]:
    producer = {tensor: i for i, step in enumerate(wiring.steps) for tensor in step.outputs.values()}
    return [(producer[tensor], i) for i, step in enumerate(wiring.steps) for tensor in step.inputs.values()
            if tensor in producer]


def _reaches(edges: List[Tuple[int, int]], start: int, goal: int) -> bool:
    nexts: Dict[int, List[int]] = {}
    for a, b in edges:
        nexts.setdefault(a, []).append(b)
    seen, stack = set(), [start]
    while stack:
        node = stack.pop()
        if node == goal:
            return True
        if node in seen:
            continue
        seen.add(node)
        stack.extend(nexts.get(node, []))
    return False


def fusion_groups(wiring: EnsembleWiring, sources: Mapping[str, StepSource]
                  ) -> Tuple[List[List[int]], Dict[int, str]]:
    """Steps latte can run, in connected groups of one device each (steps in ensemble order),
    and the reason each other step stays in Triton's ensemble."""
    count = len(wiring.steps)
    unfused = {i: sources[s.model].reason for i, s in enumerate(wiring.steps) if sources[s.model].reason}
    group_of = {i: i for i in range(count) if i not in unfused}
    device = {i: sources[wiring.steps[i].model].device for i in group_of}
    edges = _edges(wiring)

    def root(i: int) -> int:
        while group_of[i] != i:
            i = group_of[i]
        return i

    for a, b in edges:
        if a not in group_of or b not in group_of:
            continue
        ra, rb = root(a), root(b)
        if ra == rb:
            continue
        if device[ra] and device[rb] and device[ra] != device[rb]:
            continue  # another device: kept apart, the ensemble moves the tensor between them
        # One model for both must not need a step outside it in between (A -> unfused -> B with A -> B).
        members = [i for i in group_of if root(i) in (ra, rb)]
        outside = [i for i in range(count) if i not in members]
        contracted = [(x if x not in members else -1, y if y not in members else -1) for x, y in edges]
        if any(_reaches(contracted, -1, o) and _reaches(contracted, o, -1) for o in outside):
            continue
        group_of[rb] = ra
        device[ra] = device[ra] or device[rb]
    groups: Dict[int, List[int]] = {}
    for i in sorted(group_of):
        groups.setdefault(root(i), []).append(i)
    ordered = sorted(groups.values(), key=lambda g: g[0])
    fused = [g for g in ordered if len(g) > 1 or len(ordered) == 1 and len(g) == count]
    for g in ordered:
        if g not in fused:
            only = g[0]
            unfused[only] = "no step next to it fuses with it, and a step alone gains nothing fused"
    return fused, unfused


# -- the fused model ----------------------------------------------------------------------
def _tensor_context(name: str, info: TensorInfo) -> Dict:
    ragged = -1 in info.dims and info.data_type != "TYPE_STRING"
    return {"name": name, "data_type": info.data_type, "dims": list(info.dims), "allow_ragged_batch": ragged,
            "optional": False}


def _boundary(wiring: EnsembleWiring, group: Sequence[int], sources: Mapping[str, StepSource]
              ) -> Tuple[Dict[str, TensorInfo], Dict[str, TensorInfo]]:
    """The group's inputs (tensors it reads that come from outside it) and outputs (tensors it
    makes that the rest of the ensemble or its clients read), with their declarations."""
    inside = set(group)
    made_inside = {t for i in group for t in wiring.steps[i].outputs.values()}
    read_outside = {t for i, s in enumerate(wiring.steps) if i not in inside for t in s.inputs.values()}
    inputs: Dict[str, TensorInfo] = {}
    outputs: Dict[str, TensorInfo] = {}
    for i in group:
        step = wiring.steps[i]
        interface = sources[step.model].interface
        for own, tensor in step.inputs.items():
            if tensor not in made_inside and tensor not in inputs:
                inputs[tensor] = wiring.inputs.get(tensor) or interface.inputs[own]
        for own, tensor in step.outputs.items():
            if tensor in wiring.outputs or tensor in read_outside:
                outputs[tensor] = wiring.outputs.get(tensor) or interface.outputs[own]
    return inputs, outputs


def fused_model(name: str, wiring: EnsembleWiring, group: Sequence[int], sources: Mapping[str, StepSource],
                max_batch_size: Optional[int] = None, samples: Sequence[Mapping] = ()) -> FusedModel:
    """The latte model that runs the group's steps as one graph."""
    inputs, outputs = _boundary(wiring, group, sources)
    steps: List[Dict] = []
    files: Dict[str, Path] = {}
    for i in group:
        wired = wiring.steps[i]
        source = sources[wired.model]
        folder = f"steps/{source.model}"
        entry = {"name": source.model, "folder": folder, "inputs": dict(wired.inputs), "outputs": dict(wired.outputs),
                 "config": source.config}
        if source.function:
            entry["function"] = source.function
        steps.append(entry)
        for file_name, path in source.files.items():
            files[f"{folder}/{STEP_VERSION}/{file_name}"] = path
    members = [sources[wiring.steps[i].model] for i in group]
    models = [m for m in members if m.device is not None]
    batch = max([max_batch_size or 0, wiring.max_batch_size] + [m.interface.max_batch_size for m in members])
    delays = [m.queue_delay_us for m in models if m.queue_delay_us is not None]
    graph = {"format": GRAPH_FORMAT,
             "inputs": [{"name": n, "data_type": t.data_type, "dims": list(t.dims)} for n, t in inputs.items()],
             "outputs": [{"name": n, "data_type": t.data_type, "dims": list(t.dims)} for n, t in outputs.items()],
             "steps": steps}
    if samples:
        graph["samples"] = [dict(s) for s in samples]
    kind = "KIND_GPU" if any(m.device == "gpu" for m in models) else "KIND_CPU"
    context = {
        "name": name, "backend": "latte", "max_batch_size": batch or DEFAULT_MAX_BATCH_SIZE,
        "inputs": [_tensor_context(n, t) for n, t in inputs.items()],
        "outputs": [_tensor_context(n, t) | {"allow_ragged_batch": False} for n, t in outputs.items()],
        "dynamic_batching": {"max_queue_delay_microseconds": max(delays) if delays else DEFAULT_QUEUE_DELAY_US},
        "instance_groups": [{"count": max([1] + [m.instance_count for m in models]), "kind": kind}],
        "parameters": {"model_file": GRAPH_FILE, "runtime": "graph",
                       "intra_op_threads": str(max([1] + [m.intra_op_threads for m in models]))},
    }
    return FusedModel(name=name, steps=[wiring.steps[i].model for i in group], context=context, graph=graph,
                      files=files)


def fuse_ensemble(wiring: EnsembleWiring, sources: Mapping[str, StepSource], taken: Sequence[str] = (),
                  max_batch_size: Optional[int] = None, samples: Sequence[Mapping] = ()) -> Fusion:
    """Fuse what latte can run of one ensemble; `taken` are model names already in use."""
    if wiring.max_batch_size == 0:
        return Fusion(wiring.name, [], {s.model: "the ensemble does not batch (max_batch_size 0)"
                                        for s in wiring.steps})
    groups, unfused = fusion_groups(wiring, sources)
    reasons = {wiring.steps[i].model: why for i, why in sorted(unfused.items())}
    if len(groups) == 1 and len(groups[0]) == len(wiring.steps):
        return Fusion(wiring.name, [fused_model(wiring.name, wiring, groups[0], sources, max_batch_size, samples)])
    names, fused = set(taken) | {wiring.name}, []
    for k, group in enumerate(groups):
        name = f"{wiring.name}_fused" + (f"_{k + 1}" if len(groups) > 1 else "")
        while name in names:
            name += "_"
        names.add(name)
        fused.append(fused_model(name, wiring, group, sources, max_batch_size))
    # The ensemble keeps its unfused steps and calls each fused group as one step, wired by the
    # ensemble's own tensor names (the fused model's inputs and outputs are named after them).
    in_group = {i: model for model, group in zip(fused, groups) for i in group}
    steps, placed = [], set()
    for i, step in enumerate(wiring.steps):
        model = in_group.get(i)
        if model is None:
            steps.append({"model": step.model, "inputs": dict(step.inputs), "outputs": dict(step.outputs)})
        elif model.name not in placed:
            placed.add(model.name)
            steps.append({"model": model.name, "inputs": {t["name"]: t["name"] for t in model.context["inputs"]},
                          "outputs": {t["name"]: t["name"] for t in model.context["outputs"]}})
    return Fusion(wiring.name, fused, reasons, steps=steps if fused else None)


def write_fused_model(repo: Path, model: FusedModel, templates: Optional[Path] = None) -> Path:
    """REPO/<name>/: its config.pbtxt, 1/graph.json and each step's files under 1/steps/<step>/1/."""
    from latte.generator.model_folder import write_model

    model_dir = write_model(repo, model.context, {}, templates=templates)
    version = model_dir / "1"
    (version / GRAPH_FILE).write_text(json.dumps(model.graph, indent=2) + "\n")
    for relative, source in model.files.items():
        target = version / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(source).is_dir():  # a Python step's own package, next to its model.py
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return model_dir


# -- a hand-written repository (`latte fuse`) ---------------------------------------------
def _version_folder(model_dir: Path, version: int) -> Path:
    """The folder an ensemble step's model_version names (-1: the newest there is)."""
    if version > 0:
        return model_dir / str(version)
    numbered = sorted((int(d.name) for d in model_dir.iterdir() if d.is_dir() and d.name.isdigit()), reverse=True)
    return model_dir / str(numbered[0]) if numbered else model_dir / "1"


def _ensemble_context(config) -> Dict:
    from tritonclient.grpc import model_config_pb2

    def tensors(entries):
        return [{"name": t.name, "data_type": model_config_pb2.DataType.Name(t.data_type), "dims": list(t.dims),
                 "optional": getattr(t, "optional", False)} for t in entries]

    return {"name": config.name, "max_batch_size": config.max_batch_size, "inputs": tensors(config.input),
            "outputs": tensors(config.output)}


def fuse_repository(repo: Path, ensemble: str, out: Path, samples: Optional[Path] = None,
                    templates: Optional[Path] = None) -> Fusion:
    """Copy the repository REPO to OUT with ENSEMBLE's steps that latte can run fused into one
    latte model (under the ensemble's name when they are all of them), and validate OUT.
    Raises FuseError naming the file and line of what stops it."""
    from latte.backend.samples import encode_sample
    from latte.generator.model_folder import write_ensemble
    from latte.generator.validate import ensemble_wiring, read_config_file, validate_repository
    from latte.triton.perf import read_input_data

    repo, out = Path(repo), Path(out)
    configs = validate_repository(repo)
    if ensemble not in configs:
        raise FuseError(f"{repo}: no model {ensemble!r} (models: {', '.join(sorted(configs))})")
    found = read_config_file(repo / ensemble / "config.pbtxt")
    if found.config.platform != "ensemble":
        raise FuseError(f"{found.where(('platform',))}: {ensemble!r} is not an ensemble (platform "
                        f"{found.config.platform or '(none)'!r}, backend {found.config.backend or '(none)'!r})")
    if out.resolve() == repo.resolve():
        raise FuseError(f"{out}: write the fused repository to another folder than {repo}")
    if out.exists() and any(out.iterdir()):
        raise FuseError(f"{out}: the folder exists and is not empty")
    wiring = ensemble_wiring(found.config)
    sources = {}
    for step in found.config.ensemble_scheduling.step:
        if step.model_name in sources:
            continue
        version = _version_folder(repo / step.model_name, step.model_version)
        files = {p.name: p for p in sorted(version.iterdir())} if version.is_dir() else {}
        sources[step.model_name] = step_source(configs[step.model_name], files)
    kept = []
    if samples is not None:
        kept = [{name: encode_sample(array) for name, array in request.items()}
                for request in read_input_data(samples)[:3]]
    fusion = fuse_ensemble(wiring, sources, taken=list(configs), samples=kept)
    if not fusion.fused:
        reasons = "; ".join(f"step {step!r}: {why}" for step, why in fusion.unfused.items())
        raise FuseError(f"{found.where(('ensemble_scheduling',))}: nothing to fuse ({reasons})")
    out.mkdir(parents=True, exist_ok=True)
    for model_dir in sorted(d for d in repo.iterdir() if d.is_dir()):
        shutil.copytree(model_dir, out / model_dir.name)
    for model in fusion.fused:
        write_fused_model(out, model, templates)
    if not fusion.replaced:
        write_ensemble(out, {**_ensemble_context(found.config), "steps": fusion.steps}, templates)
    validate_repository(out)
    return fusion
