"""The steps a graph runs, behind one small interface: `run(values, members) -> values`.

- ModelStep: an ONNX, TorchScript or torch.export model. A plain model is a graph of one
  model step; inside a larger graph the step plans as that model served alone does: its
  planner cuts a ragged tensor by its rows' lengths into sub-batches (the cost model measured
  at load by serving the step alone, a graph of one step), each padded to its longest row,
  run and checked as the engine runs and checks a served batch, the outputs put back in row
  order.
- FunctionStep: a plain Python function on batch arrays, called once per batch.
- python_model.PythonModelStep: an unchanged TritonPythonModel, called in process.

`values` are keyed by the step's own tensor names (the graph maps them); a step raises when
it fails, and the graph says which step it was.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from latte.backend.batching import Batch, conform_outputs
from latte.backend.config import ModelSpec, TensorSpec
from latte.backend.errors import RequestError
from latte.backend.planner import BatchPlanner
from latte.backend.graph.values import Value, gather, measure_lengths, repadded, scatter, variable_axes
from latte.backend.runtimes.base import Runtime

Values = Dict[str, Value]


class Step:
    """One node of a graph: its name and the tensors it reads and writes, under its own names."""

    kind = "step"

    def __init__(self, name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 pad_value: float = 0.0) -> None:
        self.name = name
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.pad_value = pad_value
        self.output_axes = {t.name: variable_axes(t.dims) for t in outputs}
        self.namespace = None  # a Python step's import namespace (step_imports), closed with it
        # Whether the step takes torch tensors, and hands its outputs on as tensors on its
        # device (the graph decides, where every reader of them takes tensors there).
        self.takes_tensors = False
        self.keeps_tensors = False
        self.device = "cpu"

    def run(self, values: Values, members: Sequence[int]) -> Values:
        raise NotImplementedError

    def measure(self) -> None:
        """Time what the step's planning needs, once at load (a model step's cost model)."""

    def close(self) -> None:
        if self.namespace is not None:
            self.namespace.close()
            self.namespace = None


class ModelStep(Step):
    kind = "model"

    def __init__(self, name: str, spec: ModelSpec, runtime: Runtime) -> None:
        signature, serving = spec.signature, spec.serving
        super().__init__(name, signature.inputs, signature.outputs, serving.pad_value)
        self.spec = spec
        self.runtime = runtime
        # The model's one planner: the engine's own when the model is served alone (a graph of
        # this one step), so the same model takes the same plan for the same requests.
        self.planner = BatchPlanner(spec)
        self.max_length = serving.max_sequence_length
        self._out_dtypes = {t.name: t.dtype for t in signature.outputs}
        self._batched = signature.batched
        # A torch runtime takes tensors, and hands its outputs on as tensors on its device when
        # every reader of them is a torch step of that device (the graph decides: keeps_tensors).
        self.device = str(runtime.device)
        self.takes_tensors = runtime.takes_tensors
        # Every input with a variable dimension is padded and planned by its rows' lengths: inside
        # a graph rows of one batch differ in length whether or not the step's config says
        # allow_ragged_batch (Triton's batcher never mixed them; the graph's batch does).
        self._variable = {t.name for t in signature.inputs if -1 in t.dims}

    @classmethod
    def load(cls, name: str, spec: ModelSpec):
        """The step of the model `spec` describes, at its configured precision, and the accuracy
        report when that is not FP32: a plain model and a step of a graph load alike."""
        from latte.backend.precision import load_at_precision
        from latte.backend.warmup import warmup_shapes

        runtime, accuracy = load_at_precision(spec, warmup_shapes(spec))
        return cls(name, spec, runtime), accuracy

    def measure(self) -> None:
        """The planner's cost model, timed by serving the step alone: the engine of a graph of
        this one step, the path a plain model serves on."""
        from latte.backend.engine import BatchEngine
        from latte.backend.graph.graph import Graph
        from latte.backend.warmup import measure_cost_model

        measured = measure_cost_model(BatchEngine(self.spec, Graph.of_step(self)))
        if measured is not None:
            self.planner.cost_model = measured

    def run_batch(self, batch: Batch) -> Tuple[Dict[str, np.ndarray], None]:
        """One call of the model on a batch as packed: its outputs conformed to the declared
        types and checked to hold the batch's rows; no row's own length (a model's outputs are
        every row's full width, or cut back by the config's declared dims: Runtime.run_batch).
        A plain model's walk is this call on the batch the engine packed; inside a larger graph
        `run` makes each of its sub-batches this call."""
        return conform_outputs(self.runtime.run(batch.inputs), self._out_dtypes,
                               batch.rows if self._batched else None), None

    def plan(self, lengths: Optional[np.ndarray], rows: int) -> List[Optional[np.ndarray]]:
        """Row indices of each sub-batch (the served model's plan of one-row requests); [None]
        when the whole batch is one call, in order."""
        groups = self.planner.plan([1] * rows, None if lengths is None or rows == 1 else lengths.tolist())
        if len(groups) == 1 and len(groups[0]) == rows and list(groups[0]) == sorted(groups[0]):
            return [None]
        return [np.asarray(group) for group in groups]

    def _lengths(self, values: Values) -> Tuple[Optional[np.ndarray], Optional[int]]:
        """Each row's length across the variable inputs, and the longest; (None, None) without."""
        lengths = None
        for name in self._variable:
            found = values[name].row_lengths()
            if found is not None:
                lengths = found if lengths is None else np.maximum(lengths, found)
        if lengths is None or not len(lengths):
            return None, None
        longest = int(lengths.max())
        if self.max_length and longest > self.max_length:
            raise RequestError(f"step {self.name!r}: length {longest} exceeds the step's maximum of {self.max_length}")
        return lengths, longest

    def run(self, values: Values, members: Sequence[int]) -> Values:
        rows = values[self.inputs[0].name].rows
        lengths, longest = self._lengths(values)
        variable = self._variable
        padded = {t.name: repadded(values[t.name], self.pad_value) if t.name in variable
                  else values[t.name].array for t in self.inputs}
        parts: List[Tuple[Optional[np.ndarray], Optional[int], Dict[str, np.ndarray]]] = []
        for group in self.plan(lengths, rows):
            length = longest if group is None else (None if lengths is None else int(lengths[group].max()))
            feed = {t.name: gather(padded[t.name], values[t.name].axes if t.name in variable else (), group,
                                   length if t.name in variable else None) for t in self.inputs}
            expected = rows if group is None else len(group)
            if self.keeps_tensors:  # tensors on the step's device: rows checked, types as they are
                outputs = conform_outputs(self.runtime.run_tensors(feed), None, expected)
            else:  # the call a served batch is: declared types, rows checked
                rows_lengths = None if lengths is None else (lengths if group is None else lengths[group])
                outputs, _ = self.run_batch(Batch(inputs=feed, member_rows=[expected], lengths=rows_lengths,
                                                  padded_length=length, rows=expected))
            parts.append((group, length, outputs))
            del feed  # arena-backed sub-batches go back as soon as the call is over
        return {t.name: self._output(t.name, parts, rows, lengths) for t in self.outputs}

    def _output(self, name: str, parts, rows: int, lengths: Optional[np.ndarray]) -> Value:
        axes = self.output_axes[name]
        if len(parts) == 1 and parts[0][0] is None:
            _, length, outputs = parts[0]
            array = outputs[name]
            # A variable output as long as the input it came from (per-token outputs) follows the
            # rows' own lengths; any other keeps its full width.
            follows = axes and lengths is not None and array.shape[axes[0]] == length
            return Value(array, axes, lengths if follows else None, self.pad_value)
        array = scatter([(group, outputs[name]) for group, _, outputs in parts], rows, axes, self.pad_value)
        if not axes:
            return Value(array)
        out_lengths = np.empty(rows, dtype=np.int64)
        for group, length, outputs in parts:
            size = outputs[name].shape[axes[0]]
            out_lengths[group] = lengths[group] if lengths is not None and size == length else size
        ragged = bool((out_lengths != array.shape[axes[0]]).any())
        return Value(array, axes, out_lengths if ragged else None, self.pad_value)

    def close(self) -> None:
        self.runtime.close()


class FunctionStep(Step):
    """`function(*inputs) -> output or tuple of outputs`, numpy arrays of the whole batch in the
    declared order. A ragged input comes padded with the step's pad value; a ragged output's
    row lengths are measured as how far each row's values other than the pad value reach. A
    ValueError refuses what the batch's requests brought (answered INVALID_ARG once each
    request has run alone); any other exception is the step's own failure."""

    kind = "function"

    def __init__(self, name: str, function: Callable, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 pad_value: float = 0.0) -> None:
        super().__init__(name, inputs, outputs, pad_value)
        self.function = function

    def run(self, values: Values, members: Sequence[int]) -> Values:
        rows = values[self.inputs[0].name].rows
        args = [repadded(values[t.name], self.pad_value) for t in self.inputs]
        try:
            result = self.function(*args)
        except ValueError as exc:
            # Python's word for a value the function cannot take: what the request brought.
            raise RequestError(f"step {self.name!r}: {exc}") from exc
        if not isinstance(result, (tuple, list)):
            result = (result,)
        if len(result) != len(self.outputs):
            raise RuntimeError(f"returned {len(result)} output(s); the step declares {len(self.outputs)} "
                               f"({', '.join(t.name for t in self.outputs)})")
        produced = {}
        for t, out in zip(self.outputs, result):
            array = np.asarray(out)
            if array.ndim == 0 or array.shape[0] != rows:
                raise RuntimeError(f"output {t.name!r} has shape {list(array.shape)}; expected {rows} rows")
            axes = self.output_axes[t.name]
            lengths = measure_lengths(array, axes, self.pad_value) if axes and array.ndim > max(axes) else None
            produced[t.name] = Value(array, axes, lengths, self.pad_value)
        return produced
