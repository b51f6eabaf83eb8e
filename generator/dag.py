"""Checks that an ensemble is a well-formed DAG of models, as Triton will execute it.

The same checks serve a spec (locations are spec file:line: key) and a rendered
repository (locations are config.pbtxt files): callers pass `where(path)`, which turns
a key path inside the ensemble, e.g. ("steps", 1, "inputs", "tokens"), into text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

Where = Callable[[Tuple], str]


class EnsembleError(ValueError):
    """One or more problems in an ensemble; `problems` holds one located line each."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class TensorInfo:
    data_type: str
    dims: Tuple[int, ...]


@dataclass
class Interface:
    """What the DAG check needs to know about a model: its batching and its tensors."""
    name: str
    max_batch_size: int
    inputs: Dict[str, TensorInfo]
    outputs: Dict[str, TensorInfo]
    optional_inputs: Tuple[str, ...] = ()
    # Where the model declares its own tensors, given ("inputs" | "outputs", name, field) with
    # field "data_type" or "dims", when it has
    # a file of its own (a repository's config.pbtxt): a tensor that disagrees with its
    # neighbours is then reported at that declaration, not at the ensemble's wiring of it.
    where: Optional[Where] = None


@dataclass
class StepWiring:
    model: str
    inputs: Dict[str, str]        # model input -> ensemble tensor
    outputs: Dict[str, str]       # model output -> ensemble tensor


@dataclass
class EnsembleWiring:
    name: str
    max_batch_size: int
    inputs: Dict[str, TensorInfo]
    outputs: Dict[str, TensorInfo]
    steps: List[StepWiring]


def shapes_agree(a: Sequence[int], b: Sequence[int]) -> bool:
    """Same rank, and every dimension equal or variable (-1) on one side."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _find_cycle(edges: Dict[int, List[int]], count: int) -> Optional[List[int]]:
    state = [0] * count  # 0 unvisited, 1 on the stack, 2 done
    stack: List[int] = []

    def visit(node: int) -> Optional[List[int]]:
        state[node] = 1
        stack.append(node)
        for nxt in edges.get(node, []):
            if state[nxt] == 1:
                return stack[stack.index(nxt):] + [nxt]
            if state[nxt] == 0:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in range(count):
        if state[start] == 0:
            found = visit(start)
            if found:
                return found
    return None


def check_ensemble(ensemble: EnsembleWiring, models: Dict[str, Interface], where: Where) -> List[str]:
    """Every problem with the ensemble, each as 'location: message'; empty when it is sound."""
    problems: List[str] = []

    def problem(path: Tuple, message: str) -> None:
        problems.append(f"{where(path)}: {message}")

    def declared(path: Tuple, step_index: Optional[int], field: str) -> Optional[str]:
        # A step's tensor field, located in its model's own file when that model has one.
        model = models.get(ensemble.steps[step_index].model) if step_index is not None else None
        if model is None or model.where is None:
            return None
        return model.where((path[2], path[3], field))

    # Which tensor comes from where: the ensemble's inputs, or exactly one step output.
    producers: Dict[str, Tuple[Tuple, TensorInfo, Optional[int]]] = {
        name: (("inputs", name), info, None) for name, info in ensemble.inputs.items()}
    consumers: Dict[str, List[Tuple[Tuple, Optional[TensorInfo], Optional[int]]]] = {}

    for i, step in enumerate(ensemble.steps):
        model = models.get(step.model)
        if model is None:
            problem(("steps", i, "model"), f"model {step.model!r} is not defined (known: {', '.join(sorted(models))})")
            continue
        if ensemble.max_batch_size > model.max_batch_size:
            problem(("steps", i, "model"), f"model {step.model!r} has max_batch_size {model.max_batch_size}, below "
                    f"the ensemble's {ensemble.max_batch_size}; Triton refuses such an ensemble")
        for model_input, tensor in step.inputs.items():
            info = model.inputs.get(model_input)
            if info is None:
                problem(("steps", i, "inputs", model_input), f"model {step.model!r} has no input {model_input!r} "
                        f"(inputs: {', '.join(sorted(model.inputs))})")
            consumers.setdefault(tensor, []).append((("steps", i, "inputs", model_input), info, i))
        for name in model.inputs:
            if name not in step.inputs and name not in model.optional_inputs:
                problem(("steps", i, "inputs"), f"model {step.model!r} needs input {name!r}, which the step does "
                        "not map")
        for model_output, tensor in step.outputs.items():
            info = model.outputs.get(model_output)
            if info is None:
                problem(("steps", i, "outputs", model_output), f"model {step.model!r} has no output "
                        f"{model_output!r} (outputs: {', '.join(sorted(model.outputs))})")
            here = ("steps", i, "outputs", model_output)
            if tensor in producers:
                first = producers[tensor][0]
                problem(here, f"tensor {tensor!r} is produced twice (also by {where(first)})")
                continue
            producers[tensor] = (here, info, i)

    for name, info in ensemble.outputs.items():
        consumers.setdefault(name, []).append((("outputs", name), info, None))

    edges: Dict[int, List[int]] = {}
    for tensor, uses in consumers.items():
        source = producers.get(tensor)
        for path, info, step_index in uses:
            if source is None:
                what = "ensemble output" if step_index is None else "step input"
                problem(path, f"{what} tensor {tensor!r} is never produced: no step output or ensemble input "
                        "has that name")
                continue
            source_path, source_info, source_step = source
            if source_step is not None and step_index is not None:
                edges.setdefault(source_step, []).append(step_index)
            if info is None or source_info is None:
                continue
            if info.data_type != source_info.data_type:
                field = "data_type"
            elif not shapes_agree(info.dims, source_info.dims):
                field = "dims"
            else:
                continue
            there = declared(source_path, source_step, field) or where(source_path)
            if field == "data_type":
                text = f"tensor {tensor!r} is {source_info.data_type} at {there} but {info.data_type} here"
            else:
                text = f"tensor {tensor!r} has dims {list(source_info.dims)} at {there} but {list(info.dims)} here"
            here = declared(path, step_index, field)
            if here is None:
                problem(path, text)
            else:
                problems.append(f"{here}: {text} (wired at {where(path)})")
    for tensor, (path, _, step_index) in producers.items():
        if tensor not in consumers:
            what = "ensemble input" if step_index is None else "step output"
            problem(path, f"{what} tensor {tensor!r} is never consumed by a step or an ensemble output")

    cycle = _find_cycle(edges, len(ensemble.steps))
    if cycle:
        chain = " -> ".join(f"{ensemble.steps[s].model} (step {s})" for s in cycle)
        problem(("steps", cycle[0]), f"the steps form a cycle: {chain}")
    return problems
