"""The engine's model of every model: a graph of steps, whose `run_batch(batch)` walks the
steps in topological order, each once per batch, the batch's tensors handed from step to
step in this process (no hop through Triton between them). A plain model is a graph of one
model step whose tensors are the graph's own: its walk is that step's runtime called on the
batch as the engine packed it. A fused model's graph comes from its graph.json.

Intermediates come from the model's arena where a step makes them and are dropped as soon
as their last reader has run. At load every model step times its planner's costs, then a
sample batch runs through the graph and every edge is checked: a step whose output's data
type or shape differs from what its readers declare is refused, naming the step, the tensor
and both sides. A step that raises fails the batch, with the step named; the engine then
answers each request alone, so only the requests the step fails on fail.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from latte.backend.batching import Batch, conform_outputs
from latte.backend.batch_runner import failure_text
from latte.backend.config import ModelSpec, TensorSpec, parameters_of, parse_model_config, parse_tensors
from latte.backend.precision import AccuracyReport
from latte.backend.dtypes import NUMPY_TO_TRITON, to_numpy, wire_name
from latte.backend.samples import decode_sample
from latte.backend.errors import ConfigError, ModelError, OutOfMemory, RequestError, device_out_of_memory
from latte.backend.graph.definition import GraphDefinition, StepDefinition, TensorDeclaration, load_graph
from latte.backend.graph.python_model import STEP_FILE, PythonModelStep, load_step_module, step_function
from latte.backend.graph.steps import FunctionStep, ModelStep, Step
from latte.backend.graph.values import Value, host_dtype, on_host, stack_members, variable_axes

# Rows of the sample batch run at load; lengths of its variable dimensions, one per row.
CHECK_LENGTHS = (3, 9, 5)
# Branches go to helper threads when, on the sample batch at load (median of this many runs
# each way, interleaved), that takes at most this share of the time one after the other takes.
BRANCH_TRIALS = 15
BRANCH_GAIN = 0.9
# Batches whose per-step times wait to be counted, at most (step_figures folds them).
UNFOLDED_BATCHES = 4096


def _type_text(dtype: np.dtype) -> str:
    name = NUMPY_TO_TRITON.get(np.dtype(dtype))
    return wire_name(name) if name else str(dtype)


def _declared_text(spec: TensorSpec) -> str:
    return f"{_type_text(spec.dtype)} {spec.shape_text(True)}"


def _value_text(value: Value) -> str:
    return f"{_type_text(host_dtype(value.array))} {list(value.array.shape)}"


def _agrees(value: Value, spec: TensorSpec) -> bool:
    array = value.array
    if host_dtype(array) != spec.dtype or array.ndim != len(spec.dims) + 1:
        return False
    return all(d == -1 or d == size for d, size in zip(spec.dims, array.shape[1:]))


def _spec_of(declaration: TensorDeclaration) -> TensorSpec:
    return TensorSpec(declaration.name, to_numpy(declaration.data_type), declaration.dims)


def load_model(spec: ModelSpec) -> Tuple["Graph", Optional[AccuracyReport]]:
    """The graph the model `spec` describes runs, and the accuracy report when a plain model is
    served at another precision than FP32: its graph.json's steps (each at its own precision,
    the config refuses another for the graph), or one model step."""
    signature, serving = spec.signature, spec.serving
    if signature.runtime == "stream":
        raise ConfigError(f"model {signature.name!r}: {signature.model_path.name} is a streaming model, which sends "
                          "many responses per request; set model_transaction_policy { decoupled: true }")
    if signature.runtime == "graph":
        return Graph(signature.model_path, [t.name for t in signature.inputs], [t.name for t in signature.outputs],
                     serving.intra_op_threads, serving.inter_op_threads, serving.device, serving.freeze), None
    step, accuracy = ModelStep.load(signature.name, spec)
    return Graph.of_step(step), accuracy


class Graph:
    """Steps in topological order, checked once at load; `run_batch` walks them. It answers a
    model runtime's run_batch, samples and close, so a tool that profiles a model file takes
    either."""

    kind = "graph"
    # A graph of one model step plans with that step's planner (the model served alone);
    # a graph of several steps is planned by its own spec's.
    planner = None

    @classmethod
    def of_step(cls, step: ModelStep) -> "Graph":
        """A plain model: a graph of one model step whose inputs and outputs are the graph's.
        Nothing to wire, check or count between steps: the walk is the step's runtime called
        on the batch, and the engine's own figures are the step's."""
        graph = cls.__new__(cls)
        graph.input_names = [t.name for t in step.inputs]
        graph.output_names = [t.name for t in step.outputs]
        graph.definition, graph.device, graph.steps = None, step.device, [step]
        graph.notes = list(getattr(step.runtime, "notes", ()))
        graph.planner = step.planner
        graph._branches = None
        graph.run_batch = step.run_batch  # the walk of one step: its call on the batch as packed
        return graph

    def __init__(self, path, input_names: Sequence[str], output_names: Sequence[str], intra_op_threads: int,
                 inter_op_threads: int, device: str = "cpu", freeze: bool = True) -> None:
        self.input_names, self.output_names = list(input_names), list(output_names)
        self.definition = graph = load_graph(Path(path))
        declared_in, declared_out = [t.name for t in graph.inputs], [t.name for t in graph.outputs]
        if sorted(declared_in) != sorted(input_names) or sorted(declared_out) != sorted(output_names):
            raise ConfigError(f"{graph.path}: the graph takes {declared_in} and answers {declared_out}; the model "
                              f"config declares inputs {list(input_names)} and outputs {list(output_names)}")
        self.device = device
        self._threads = (intra_op_threads, inter_op_threads)
        self._freeze = freeze  # the steps' default: a step's own config may say otherwise
        # Set before any step loads: close() after a failed load must not fail in its turn.
        self._branches: Optional[ThreadPoolExecutor] = None
        self.steps: List[Step] = []
        try:
            for definition in graph.steps:
                self.steps.append(self._load(definition))
            self._wire(graph)
            self.notes.extend(f"{step.name}: {note}" for step in self.steps
                              for note in getattr(getattr(step, "runtime", None), "notes", ()))
            self.check()  # before any step is timed: a mismatch is reported as one, not as a model error
            for step in self.steps:
                step.measure()
            self._choose_branches(graph.branches)
        except BaseException:
            self.close()
            raise
        self._unfolded = []  # load's own batches are not served ones

    def _wire(self, graph: GraphDefinition) -> None:
        """What every batch's walk reads: each step's wiring, the levels, where tensors stay."""
        self._inputs = {t.name: _spec_of(t) for t in graph.inputs}
        self._outputs = {t.name: _spec_of(t) for t in graph.outputs}
        self._input_axes = {name: variable_axes(spec.dims) for name, spec in self._inputs.items()}
        self._ragged_inputs = any(self._input_axes.values())
        self._ragged_outputs = [t.name for t in graph.outputs if -1 in t.dims]
        self._out_dtypes = {name: spec.dtype for name, spec in self._outputs.items()}
        self._wiring = [(tuple(d.inputs.items()), tuple(d.outputs.items())) for d in graph.steps]
        self._levels = self._plan_levels(graph)
        self._keep_tensors(graph)
        # Steps that may be handed a tensor kept on a device but read numpy: their inputs are
        # copied to the host first (none, unless some torch step keeps its outputs).
        kept = any(step.keeps_tensors for step in self.steps)
        self._to_host = [kept and not step.takes_tensors for step in self.steps]
        self._lock = threading.Lock()  # scheduler lanes run batches from their own threads
        self._figures = [[0.0, 0, 0] for _ in self.steps]  # seconds, rows, calls
        self._unfolded: List[Tuple[List[float], int]] = []  # (seconds per step, rows) of batches not yet counted
        self.notes: List[str] = []  # what the server log should say about the graph
        self._checked = False

    # -- load ---------------------------------------------------------------------------
    def _load(self, definition: StepDefinition) -> Step:
        if definition.backend == "python":
            return self._load_python(definition)
        return self._load_model(definition)

    def _load_python(self, definition: StepDefinition) -> Step:
        config, name = definition.config, definition.name
        try:
            inputs, outputs = parse_tensors(config)
            pad = float(parameters_of(config).get("pad_value") or 0.0)
        except (ConfigError, ValueError) as exc:
            raise ConfigError(f"{self.definition.where(definition)}: {exc}") from None
        path = definition.version_dir / STEP_FILE
        if not definition.function:
            return PythonModelStep.load(name, path, definition.folder, config, inputs, outputs, self.device, pad)
        module, namespace = load_step_module(path, name)
        try:
            step = FunctionStep(name, step_function(module, definition.function, name, path), inputs, outputs, pad)
        except BaseException:
            namespace.close()
            raise
        step.namespace = namespace
        return step

    def _load_model(self, definition: StepDefinition) -> Step:
        if definition.backend != "latte":
            raise ConfigError(f"{self.definition.where(definition)}: backend {definition.backend!r} cannot run "
                              "inside a graph (latte runs python and latte steps; `latte fuse` converts onnxruntime and "
                              "pytorch steps)")
        config = definition.config
        intra, inter = self._threads
        # The graph's thread budget is the fused model's: every step computes on it.
        threaded = dict(config)
        threaded["parameters"] = {"freeze": {"string_value": str(self._freeze).lower()},
                                  **(config.get("parameters") or {}),
                                  "intra_op_threads": {"string_value": str(intra)},
                                  "inter_op_threads": {"string_value": str(inter)}}
        threaded.pop("instance_group", None)
        try:
            spec = parse_model_config(threaded, definition.folder, "1", device=self.device)
            step, _ = ModelStep.load(definition.name, spec)
        except ConfigError as exc:
            raise ConfigError(f"{self.definition.where(definition)}: {exc}") from None
        except Exception as exc:  # the runtime's own refusal of the model file
            raise ConfigError(f"{self.definition.where(definition)}: loading its model failed: "
                              f"{failure_text(exc)}") from exc
        return step

    def _keep_tensors(self, graph: GraphDefinition) -> None:
        """Torch steps whose every output is read only by torch steps of their device hand their
        outputs on as tensors on that device: on a GPU, intermediates between GPU steps stay
        there."""
        readers: Dict[str, List[int]] = {}
        for index, definition in enumerate(graph.steps):
            for tensor in definition.inputs.values():
                readers.setdefault(tensor, []).append(index)
        answered = {t.name for t in graph.outputs}
        for index, step in enumerate(self.steps):
            if not step.takes_tensors:
                continue
            made = list(graph.steps[index].outputs.values())
            step.keeps_tensors = bool(made) and all(
                tensor not in answered and readers.get(tensor)
                and all(self.steps[r].takes_tensors and self.steps[r].device == step.device
                        for r in readers[tensor])
                for tensor in made)

    @staticmethod
    def _plan_levels(graph: GraphDefinition) -> List[Tuple[Tuple[int, ...], Tuple[str, ...]]]:
        """The steps by level, with the tensors no later level reads (dropped once the level has
        run). A step's level is one past the deepest step it reads from, so the steps of one
        level do not read each other (independent branches) and each needs only what the
        levels before it made."""
        depth: List[int] = []
        for step in graph.steps:
            sources = [graph.producers[t][0] for t in step.inputs.values() if t in graph.producers]
            depth.append(1 + max((depth[i] for i in sources), default=-1))
        answered = {t.name for t in graph.outputs}
        last: Dict[str, int] = {}  # tensor -> the deepest level that reads it, or makes it when none does
        for index, step in enumerate(graph.steps):
            for tensor in step.outputs.values():
                last.setdefault(tensor, depth[index])
        for index, step in enumerate(graph.steps):
            for tensor in step.inputs.values():
                last[tensor] = max(last.get(tensor, -1), depth[index])
        levels = []
        for level in range(max(depth) + 1):
            steps = tuple(i for i, d in enumerate(depth) if d == level)
            frees = tuple(t for t, d in last.items() if d == level and t not in answered)
            levels.append((steps, frees))
        return levels

    def _choose_branches(self, mode: str) -> None:
        """Independent branches run on helper threads only where that measures faster than one
        after the other on the calling thread (a handoff costs more than a small step takes)."""
        widest = max(len(steps) for steps, _ in self._levels)
        if widest < 2 or mode == "inline":
            return
        pool = ThreadPoolExecutor(max_workers=widest - 1, thread_name_prefix="latte-branch")
        if mode == "parallel":
            self._branches = pool
            self.notes.append(f"branches: on {widest} threads (branches: parallel)")
            return
        batch = self.sample_batch(seed=1)
        timings = {"inline": [], "parallel": []}
        for _ in range(BRANCH_TRIALS):
            for label, threads in (("inline", None), ("parallel", pool)):
                self._branches = threads
                started = time.perf_counter()
                self._walk(batch, check=False)
                timings[label].append(time.perf_counter() - started)
        inline, parallel = (statistics.median(timings[k]) for k in ("inline", "parallel"))
        if parallel < BRANCH_GAIN * inline:
            self._branches = pool
            self.notes.append(f"branches: on {widest} threads ({inline / parallel:.2f}x faster measured at load)")
        else:
            self._branches = None
            pool.shutdown(wait=False)
            self.notes.append(f"branches: inline (on {widest} threads they measured {inline / parallel:.2f}x at load)")

    # -- run ----------------------------------------------------------------------------
    def run_batch(self, batch: Batch) -> Tuple[Dict[str, np.ndarray], Optional[Dict[str, np.ndarray]]]:
        """The outputs, and each row's own length of every ragged output, by which the engine
        trims the answers once, at the end."""
        if self._checked:
            return self._walk(batch, check=False)
        outputs = self._walk(batch, check=True)
        self._checked = True
        return outputs

    def _values(self, batch: Batch) -> Dict[str, Value]:
        if not self._ragged_inputs:
            return {name: Value(array) for name, array in batch.inputs.items()}
        lengths = batch.lengths
        values = {}
        for name, array in batch.inputs.items():
            axes = self._input_axes.get(name, ())
            values[name] = Value(array, axes, lengths if axes else None)
        return values

    def _step(self, index: int, values: Dict[str, Value], members, check: bool) -> Dict[str, Value]:
        """Run one step on what it reads: what it made, by its own names."""
        step = self.steps[index]
        if self._to_host[index]:
            inputs = {own: on_host(values[tensor]) for own, tensor in self._wiring[index][0]}
        else:
            inputs = {own: values[tensor] for own, tensor in self._wiring[index][0]}
        if check:
            self._check_inputs(index, inputs)
        try:
            produced = step.run(inputs, members)
        except (RequestError, MemoryError):
            raise  # worded for the client already (RequestError), or the arena's (MemoryError)
        except Exception as exc:
            if device_out_of_memory(exc):
                raise OutOfMemory(f"step {step.name!r}: {failure_text(exc)}") from exc
            raise ModelError(f"step {step.name!r} failed: {failure_text(exc)}",
                             detail=f"step {step.name!r}: {type(exc).__name__}: {exc}") from exc
        if check:
            self._check_outputs(index, produced)
        return produced

    def _timed_step(self, index: int, values: Dict[str, Value], members, check: bool):
        """_step on a helper thread, with the seconds it took there."""
        started = time.perf_counter()
        produced = self._step(index, values, members, check)
        return produced, time.perf_counter() - started

    def _walk(self, batch: Batch, check: bool) -> Tuple[Dict[str, np.ndarray], Optional[Dict[str, np.ndarray]]]:
        members = batch.member_rows
        values = self._values(batch)
        spent = [0.0] * len(self.steps)
        branches = self._branches
        wiring = self._wiring
        clock = time.perf_counter
        mark = clock()
        for level, frees in self._levels:
            if branches is None or len(level) == 1:
                for index in level:  # one after the other on this thread: each step's time runs to the next mark
                    produced = self._step(index, values, members, check)
                    now = clock()
                    spent[index], mark = now - mark, now
                    for own, tensor in wiring[index][1]:
                        values[tensor] = produced[own]
            else:
                # The first step on this thread, the others on helpers; each reads only what
                # earlier levels made, and what they make is written once all are done.
                helpers = [(index, branches.submit(self._timed_step, index, values, members, check))
                           for index in level[1:]]
                done = [(level[0], self._timed_step(level[0], values, members, check))]
                done += [(index, future.result()) for index, future in helpers]
                for index, (produced, seconds) in done:
                    spent[index] = seconds
                    for own, tensor in wiring[index][1]:
                        values[tensor] = produced[own]
                del done
                mark = clock()
            del produced  # what the level made is in `values` now, and nowhere else
            for tensor in frees:
                values.pop(tensor, None)
        # Counted when the figures are read (step_figures): one append here, atomic under the GIL;
        # folded here past a bound, so a graph whose figures nobody reads stays the same size.
        self._unfolded.append((spent, batch.rows))
        if len(self._unfolded) >= UNFOLDED_BATCHES:
            self.step_figures()
        return self._graph_outputs(values, batch.rows, check)

    def _graph_outputs(self, values: Dict[str, Value], rows: int, check: bool
                       ) -> Tuple[Dict[str, np.ndarray], Optional[Dict[str, np.ndarray]]]:
        """The graph's outputs, checked against the config on the first batch, conformed to
        their declared types and checked to hold the batch's rows on every batch; and each
        row's own length of every ragged one."""
        if check:
            for name, spec in self._outputs.items():
                if not _agrees(values[name], spec):
                    raise ConfigError(f"{self.definition.path.name}: graph output {name!r} comes out "
                                      f"{_value_text(values[name])}; the model config declares {_declared_text(spec)}")
        lengths = {name: values[name].lengths for name in self._ragged_outputs if values[name].lengths is not None}
        return conform_outputs({name: values[name].array for name in self.output_names}, self._out_dtypes,
                               rows), lengths or None

    # -- checks at load -----------------------------------------------------------------
    def _producer(self, tensor: str) -> str:
        found = self.definition.producers.get(tensor)
        if found is None:
            return f"graph input {tensor!r}"
        index, own = found
        return f"step {self.steps[index].name!r} output {own!r}"

    def _check_inputs(self, index: int, inputs: Mapping[str, Value]) -> None:
        step = self.steps[index]
        reads = dict(self._wiring[index][0])
        for spec in step.inputs:
            value = inputs.get(spec.name)
            if value is None:
                raise ConfigError(f"{self.definition.path.name}: step {step.name!r} input {spec.name!r} is not wired to "
                                  "any graph tensor")
            if not _agrees(value, spec):
                raise ConfigError(f"{self.definition.path.name}: {self._producer(reads[spec.name])} is "
                                  f"{_value_text(value)}, but step {step.name!r} reads it as input {spec.name!r} "
                                  f"declared {_declared_text(spec)}")

    def _check_outputs(self, index: int, produced: Mapping[str, Value]) -> None:
        step = self.steps[index]
        for spec in step.outputs:
            value = produced.get(spec.name)
            if value is None:
                raise ConfigError(f"{self.definition.path.name}: step {step.name!r} produced no output {spec.name!r}")
            if not _agrees(value, spec):
                raise ConfigError(f"{self.definition.path.name}: step {step.name!r} output {spec.name!r} comes out "
                                  f"{_value_text(value)}; the step declares {_declared_text(spec)}")

    def sample_batch(self, seed: int = 0) -> Batch:
        """A small batch, one row per request: the graph's own samples (graph.json "samples",
        real inputs its steps accept), else made-up values with variable dimensions of
        different lengths (CHECK_LENGTHS)."""
        from latte.backend.samples import sample_values

        rng = np.random.default_rng(seed)
        requests = []
        for i, length in enumerate(CHECK_LENGTHS if not self.definition.samples else self.definition.samples):
            request = {}
            for name, spec in self._inputs.items():
                if self.definition.samples:
                    request[name] = decode_sample(length[name], spec.dtype)[None]
                else:
                    dims = [length if d == -1 else d for d in spec.dims]
                    request[name] = sample_values(spec.dtype, [1, *dims], rng)
            requests.append(request)
        return self.batch_of(requests)

    def batch_of(self, requests: Sequence[Mapping[str, np.ndarray]]) -> Batch:
        """One batch of requests that bring one row each (every graph input, rows first): variable
        dimensions padded to the longest, each row's length kept where any is variable."""
        inputs, lengths = {}, None
        for name in self._inputs:
            value = stack_members([request[name] for request in requests], self._input_axes[name], 0.0)
            inputs[name] = value.array
            if value.lengths is not None:
                lengths = value.lengths if lengths is None else np.maximum(lengths, value.lengths)
        return Batch(inputs=inputs, member_rows=[1] * len(requests), lengths=lengths,
                     padded_length=None if lengths is None else int(lengths.max()), rows=len(requests))

    def check(self) -> None:
        """Run a sample batch through the graph and check every edge; raises ConfigError. When
        a step fails on made-up inputs, the edges are checked on the first batch served."""
        try:
            self._walk(self.sample_batch(), check=True)
        except (ModelError, RequestError) as exc:
            if self.definition.samples:
                raise ConfigError(f"{self.definition.path}: the graph's own samples fail: {exc}") from None
            self.notes.append(f"made-up inputs fail a step ({exc}); the graph's edges are checked on the first "
                              "batch served (graph.json \"samples\" gives inputs to check them at load)")
            return
        self._checked = True

    def samples(self) -> Optional[List[Dict[str, np.ndarray]]]:
        """graph.json's sample requests (rows first), for the model's warm-up; None: made-up
        ones do (a plain model's)."""
        if self.definition is None or not self.definition.samples:
            return None
        return [{name: decode_sample(sample[name], spec.dtype)[None] for name, spec in self._inputs.items()}
                for sample in self.definition.samples]

    # -- figures, close -----------------------------------------------------------------
    def step_figures(self) -> Dict[str, Dict[str, float]]:
        """Per step: the seconds, rows and calls it has run so far. A plain model's one step is
        counted by the engine's own figures: nothing here."""
        if self.definition is None:
            return {}
        with self._lock:
            unfolded, self._unfolded = self._unfolded, []
            for spent, rows in unfolded:
                for figures, seconds in zip(self._figures, spent):
                    figures[0] += seconds
                    figures[1] += rows
                    figures[2] += 1
            return {step.name: {"seconds": f[0], "rows": f[1], "calls": f[2]}
                    for step, f in zip(self.steps, self._figures)}

    def forget_batches(self) -> None:
        """The batches run so far are not served ones (a measurement's at load)."""
        self._unfolded = []

    def describe(self) -> str:
        """What the server log's ready line adds: the steps, and where their tensors stay."""
        if self.definition is None:
            return "; ".join(self.notes)
        text = "graph: " + " -> ".join(
            f"{step.name} ({step.kind}" + (f", tensors kept on {step.device}" if step.keeps_tensors
                                           else "") + ")" for step in self.steps)
        return "; ".join([text, *self.notes])

    def close(self) -> None:
        if self._branches is not None:
            self._branches.shutdown(wait=True)
            self._branches = None
        for step in self.steps:
            try:
                step.close()
            except Exception:
                pass  # closing goes on for the other steps; a step's error on load is the one to report
        self.steps = []
