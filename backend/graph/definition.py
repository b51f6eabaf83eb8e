"""A graph of steps as a fused model's `graph.json` declares it, checked once at load.

    {"format": "latte-graph/1",
     "inputs":  [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}],
     "outputs": [{"name": "EMBEDDING", "data_type": "TYPE_FP32", "dims": [32]}],
     "steps": [
       {"name": "tokenize", "folder": "steps/tokenize", "function": "tokenize",
        "inputs": {"TEXT": "TEXT"}, "outputs": {"TOKENS": "tokens"},
        "config": {...the step's model config, as Triton hands it to a model...}},
       ...],
     "samples": [{"TEXT": ["a first text"]}, {"TEXT": ["another"]}],   # optional
     "branches": "auto"}                                                # optional: auto, inline, parallel

Each step is a model folder under the version folder (`folder/config` is not read: the
config travels in the graph, `folder/1/` holds the step's files); its `inputs` and `outputs`
map the step's own tensor names to the graph's, as an ensemble's input_map and output_map do.
`samples` are requests (one row each, without the batch dimension) the steps accept, run
through the graph at load to check every edge. `branches` says whether independent steps (two
heads reading one tensor) run on helper threads: where that measures faster at load (`auto`),
always, or never. The steps are put in a topological order here; a tensor that is produced twice, read but
never produced, or a cycle is a ConfigError naming the step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from latte.backend.errors import ConfigError

GRAPH_FORMAT = "latte-graph/1"
BRANCH_MODES = ("auto", "inline", "parallel")
STEP_VERSION = "1"


@dataclass(frozen=True)
class TensorDeclaration:
    name: str
    data_type: str
    dims: Tuple[int, ...]


@dataclass(frozen=True)
class StepDefinition:
    name: str
    folder: Path                   # a model folder; its files are in folder/1/
    config: Mapping                # the step's model config, as Triton's JSON
    inputs: Dict[str, str]         # step input -> graph tensor
    outputs: Dict[str, str]        # step output -> graph tensor
    function: Optional[str] = None  # python steps: a function on batch arrays (else TritonPythonModel)

    @property
    def backend(self) -> str:
        return str(self.config.get("backend", ""))

    @property
    def version_dir(self) -> Path:
        return self.folder / STEP_VERSION


@dataclass(frozen=True)
class GraphDefinition:
    path: Path
    inputs: Tuple[TensorDeclaration, ...]
    outputs: Tuple[TensorDeclaration, ...]
    steps: Tuple[StepDefinition, ...]          # in topological order
    # graph tensor -> (step index, step output), for every tensor a step produces
    producers: Dict[str, Tuple[int, str]] = field(default_factory=dict)
    # requests (input name -> one row's values, as nested lists) the steps accept: the load check
    samples: Tuple[Mapping, ...] = ()
    # independent steps: "auto" (on helper threads where that measures faster), "inline", "parallel"
    branches: str = "auto"

    def where(self, step: StepDefinition) -> str:
        return f"{self.path}: step {step.name!r}"


def _tensors(raw, path: Path, key: str) -> Tuple[TensorDeclaration, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{path}: {key!r} must be a non-empty list of tensors")
    out = []
    for entry in raw:
        try:
            out.append(TensorDeclaration(str(entry["name"]), str(entry["data_type"]),
                                         tuple(int(d) for d in entry["dims"])))
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{path}: {key}: every tensor needs name, data_type and dims, got {entry!r}") from None
    return tuple(out)


def _mapping(raw, path: Path, where: str) -> Dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in raw.items()):
        raise ConfigError(f"{path}: {where} must map the step's tensor names to graph tensor names, got {raw!r}")
    return dict(raw)


def _step(raw, path: Path, index: int) -> StepDefinition:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: steps[{index}] must be a mapping")
    for key in ("name", "folder", "config", "inputs", "outputs"):
        if key not in raw:
            raise ConfigError(f"{path}: steps[{index}] has no {key!r}")
    name = str(raw["name"])
    if not isinstance(raw["config"], dict):
        raise ConfigError(f"{path}: step {name!r}: config must be a model config mapping")
    folder = path.parent / str(raw["folder"])
    if not (folder / STEP_VERSION).is_dir():
        raise ConfigError(f"{path}: step {name!r}: {folder / STEP_VERSION} does not exist")
    function = raw.get("function")
    return StepDefinition(name=name, folder=folder, config=raw["config"],
                          inputs=_mapping(raw["inputs"], path, f"step {name!r} inputs"),
                          outputs=_mapping(raw["outputs"], path, f"step {name!r} outputs"),
                          function=str(function) if function else None)


def _order(steps: List[StepDefinition], inputs: Tuple[TensorDeclaration, ...], path: Path) -> List[StepDefinition]:
    """The steps in a topological order (stable: the file's order where it is free)."""
    producer: Dict[str, str] = {t.name: "the graph's inputs" for t in inputs}
    for step in steps:
        for tensor in step.outputs.values():
            if tensor in producer:
                raise ConfigError(f"{path}: step {step.name!r} writes {tensor!r}, which {producer[tensor]} "
                                  "already provide; every graph tensor has one producer")
            producer[tensor] = f"step {step.name!r}"
    for step in steps:
        for own, tensor in step.inputs.items():
            if tensor not in producer:
                raise ConfigError(f"{path}: step {step.name!r} reads {tensor!r} (its input {own!r}), which no "
                                  "step produces and the graph does not take as an input")
    available = {t.name for t in inputs}
    ordered: List[StepDefinition] = []
    waiting = list(steps)
    while waiting:
        ready = next((s for s in waiting if set(s.inputs.values()) <= available), None)
        if ready is None:
            names = ", ".join(repr(s.name) for s in waiting)
            raise ConfigError(f"{path}: steps {names} wait on each other's outputs (a cycle)")
        waiting.remove(ready)
        ordered.append(ready)
        available.update(ready.outputs.values())
    return ordered


def read_declaration(path: Path, expected_format: str, what: str) -> dict:
    """The JSON object a latte declaration file holds (a graph, a streaming model), checked to
    be of `expected_format`; ConfigError naming the file otherwise."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != expected_format:
        raise ConfigError(f"{path}: not a latte {what} (expected \"format\": \"{expected_format}\")")
    return raw


def load_graph(path: Path) -> GraphDefinition:
    """Read and check a graph.json; raises ConfigError naming the file and the step."""
    path = Path(path)
    raw = read_declaration(path, GRAPH_FORMAT, "graph")
    inputs = _tensors(raw.get("inputs"), path, "inputs")
    outputs = _tensors(raw.get("outputs"), path, "outputs")
    if not isinstance(raw.get("steps"), list) or not raw["steps"]:
        raise ConfigError(f"{path}: 'steps' must be a non-empty list")
    steps = [_step(s, path, i) for i, s in enumerate(raw["steps"])]
    names = [s.name for s in steps]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{path}: step name {twice[0]!r} is used twice")
    ordered = _order(steps, inputs, path)
    producers = {tensor: (i, own) for i, s in enumerate(ordered) for own, tensor in s.outputs.items()}
    graph_inputs = {t.name for t in inputs}
    for t in outputs:
        if t.name not in producers and t.name not in graph_inputs:
            raise ConfigError(f"{path}: graph output {t.name!r} is produced by no step")
    samples = raw.get("samples") or []
    names = {t.name for t in inputs}
    if not isinstance(samples, list) or not all(isinstance(s, dict) and set(s) == names for s in samples):
        raise ConfigError(f"{path}: 'samples' must be a list of requests, each giving every input "
                          f"({', '.join(sorted(names))})")
    branches = raw.get("branches", "auto")
    if branches not in BRANCH_MODES:
        raise ConfigError(f"{path}: 'branches' must be one of {', '.join(BRANCH_MODES)}, got {branches!r}")
    return GraphDefinition(path=path, inputs=inputs, outputs=outputs, steps=tuple(ordered),
                           producers=producers, samples=tuple(samples), branches=branches)
