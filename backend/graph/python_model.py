"""Python steps: a step file's plain function, or its unchanged TritonPythonModel called in this
process with requests latte makes (no round trip through a stub).

A TritonPythonModel step sees what Triton would hand it in an ensemble: one request per
client request of the batch, each with that request's rows (a ragged tensor cut to the
request's own length), and answers with one InferenceResponse per request, returned or sent
through the request's response sender. Inside tritonserver it uses the stub's own
triton_python_backend_utils; elsewhere (tests, in-process runs) a stand-in of it.
"""

from __future__ import annotations

import json
import sys
import threading
import types
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from latte.backend.config import TensorSpec
from latte.backend.errors import ConfigError, RequestError
from latte.backend.graph.step_imports import StepNamespace
from latte.backend.graph.steps import Step, Values
from latte.backend.graph.values import stack_members
from latte.backend.standin_stub import Tensor as StepTensor

STEP_FILE = "model.py"


def pb_utils():
    """triton_python_backend_utils: the stub's where there is one, else latte's stand-in."""
    try:
        import triton_python_backend_utils as module
    except ImportError:
        from latte.backend.standin_stub import standin_module

        module = sys.modules["triton_python_backend_utils"] = standin_module()
    return module


def load_step_module(path: Path, step: str) -> Tuple[types.ModuleType, StepNamespace]:
    """Import a step's file in an import namespace of its own (step_imports): the modules
    beside it are its own, as in the process Triton gives each Python model."""
    if not path.is_file():
        raise ConfigError(f"step {step!r}: {path} does not exist")
    pb_utils()  # the step may import it at its top
    namespace = StepNamespace(path.parent, step)
    try:
        with namespace.loading():
            module = namespace.load(path)
    except ConfigError:
        namespace.close()
        raise
    except Exception as exc:
        namespace.close()
        raise ConfigError(f"step {step!r}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module, namespace


def step_function(module, name: str, step: str, path: Path):
    function = getattr(module, name, None)
    if not callable(function):
        raise ConfigError(f"step {step!r}: {path} defines no function {name!r}")
    return function


def _instance(module, name: str, path: Path):
    """The step file's TritonPythonModel, made as Triton makes it."""
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise ConfigError(f"step {name!r}: {path} defines no TritonPythonModel (name a plain function "
                          "with `function:` instead)")
    try:
        return model_class()
    except Exception as exc:
        raise ConfigError(f"step {name!r}: TritonPythonModel() failed: {type(exc).__name__}: {exc}") from exc


class StepSender:
    """A response sender that keeps what a decoupled model sends."""

    __slots__ = ("responses",)

    def __init__(self) -> None:
        self.responses: List = []

    def send(self, response=None, flags: int = 0) -> None:
        if response is not None:
            self.responses.append(response)


class StepRequest:
    """A request as a Python model's execute receives it, made by latte for one client request."""

    __slots__ = ("_tensors", "_outputs", "_sender")

    def __init__(self, tensors: List[StepTensor], output_names: List[str]) -> None:
        self._tensors = tensors
        self._outputs = output_names
        self._sender: Optional[StepSender] = None

    def inputs(self) -> List[StepTensor]:
        return self._tensors

    def requested_output_names(self) -> List[str]:
        return self._outputs

    def parameters(self) -> str:
        return "{}"

    def request_id(self) -> str:
        return ""

    def correlation_id(self) -> int:
        return 0

    def flags(self) -> int:
        return 0

    def timeout(self) -> int:
        return 0

    def is_cancelled(self) -> bool:
        return False

    def set_release_flags(self, flags: int) -> None:
        pass

    def get_response_sender(self) -> StepSender:
        if self._sender is None:
            self._sender = StepSender()
        return self._sender

    def sent(self):
        """The response a decoupled model sent for this request (the first with outputs)."""
        responses = self._sender.responses if self._sender is not None else []
        return next((r for r in responses if r.has_error() or r.output_tensors()), None)


def initialize_args(name: str, folder: Path, config: Mapping, device: str) -> Dict[str, str]:
    """What Triton passes a Python model's initialize, for the step's own folder and config."""
    kind = "GPU" if device.startswith("cuda") else "CPU"
    return {"model_config": json.dumps(dict(config)), "model_instance_kind": kind,
            "model_instance_name": f"{name}_0", "model_instance_device_id": device.split(":")[1] if ":" in device else "0",
            "model_repository": str(folder), "model_version": "1", "model_name": name}


class PythonModelStep(Step):
    kind = "python_model"

    def __init__(self, name: str, model, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 pad_value: float = 0.0) -> None:
        super().__init__(name, inputs, outputs, pad_value)
        self.model = model
        self._output_names = [t.name for t in outputs]
        # Triton calls a model's execute one call at a time; scheduler lanes run batches at once.
        self._executing = threading.Lock()

    @classmethod
    def load(cls, name: str, path: Path, folder: Path, config: Mapping, inputs: Sequence[TensorSpec],
             outputs: Sequence[TensorSpec], device: str, pad_value: float = 0.0) -> "PythonModelStep":
        module, namespace = load_step_module(path, name)
        try:
            step = cls(name, _instance(module, name, path), inputs, outputs, pad_value)
            step.namespace = namespace
        except BaseException:
            namespace.close()
            raise
        try:
            if hasattr(step.model, "initialize"):
                with namespace.loading():
                    try:
                        step.model.initialize(initialize_args(name, folder, config, device))
                    except Exception as exc:
                        raise ConfigError(f"step {name!r}: initialize failed: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            step.close()
            raise
        return step

    def _requests(self, values: Values, members: Sequence[int]) -> List[StepRequest]:
        requests = []
        at = 0
        for count in members:
            tensors = []
            for t in self.inputs:
                value = values[t.name]
                part = value.array[at:at + count]
                if value.lengths is not None and value.axes:
                    length = int(value.lengths[at:at + count].max())
                    index = [slice(None)] * part.ndim
                    for axis in value.axes:
                        index[axis] = slice(0, length)
                    part = part[tuple(index)]
                tensors.append(StepTensor(t.name, part))
            requests.append(StepRequest(tensors, self._output_names))
            at += count
        return requests

    def run(self, values: Values, members: Sequence[int]) -> Values:
        requests = self._requests(values, members)
        with self._executing:
            responses = self.model.execute(requests)
        if responses is None:  # decoupled: answered through the senders
            responses = [request.sent() for request in requests]
        responses = list(responses)
        if len(responses) != len(requests):
            raise RuntimeError(f"execute answered {len(responses)} response(s) for {len(requests)} request(s)")
        parts: Dict[str, List[np.ndarray]] = {name: [] for name in self._output_names}
        for response, rows in zip(responses, members):
            if response is None:
                raise RuntimeError("a request got no response")
            if response.has_error():
                self._raise(response.error())
            found = {tensor.name(): tensor for tensor in response.output_tensors()}
            for name in self._output_names:
                tensor = found.get(name)
                if tensor is None:
                    raise RuntimeError(f"a response has no output {name!r} (it has {sorted(found)})")
                array = np.asarray(tensor.as_numpy())
                if array.ndim == 0 or array.shape[0] != rows:
                    # Named here, where it happens: a later step would see a batch of fewer rows.
                    raise RuntimeError(f"answered output {name!r} with shape {list(array.shape)} for a request of "
                                       f"{rows} row(s); each response holds its request's rows")
                parts[name].append(array)
        return {name: stack_members(parts[name], self.output_axes[name], self.pad_value)
                for name in self._output_names}

    def _raise(self, error) -> None:
        message = error.message() if hasattr(error, "message") else str(error)
        code = error.code() if hasattr(error, "code") else None
        if code is not None and code == getattr(type(error), "INVALID_ARG", object()):
            raise RequestError(f"step {self.name!r}: {message}")
        raise RuntimeError(message)

    def close(self) -> None:
        try:
            if hasattr(self.model, "finalize"):
                self.model.finalize()
        except Exception:
            pass  # unloading goes on; the model's own log says why
        finally:
            super().close()
