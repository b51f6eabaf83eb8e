"""Objects shaped like the Python backend stub's, to run a LatteModel outside tritonserver:
unit tests of `execute`, and the in-process overhead benchmark (benchmarks/execute_overhead.py).

Only what latte uses of triton_python_backend_utils is here, doing as little as it can, so a
figure taken through these is latte's own cost; responses and sends are kept for inspection.
"""

from __future__ import annotations

from typing import List, Mapping, Optional

import numpy as np


class Tensor:
    """pb_utils.Tensor's reading side: a name and an array (the stub's as_numpy gives a view).
    Also what a graph's Python model step is handed as its requests' inputs."""

    __slots__ = ("_name", "_array")

    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self):
        return np.ascontiguousarray(self._array).__dlpack__()


class TritonError:
    # The codes of Triton 2.51's stub TritonError (it has no DEADLINE_EXCEEDED).
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> Optional[int]:
        return self._code


class InferenceResponse:
    def __init__(self, output_tensors: List[Tensor], error: Optional[TritonError] = None) -> None:
        self._outputs, self._error = output_tensors, error

    def output_tensors(self) -> List[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> Optional[TritonError]:
        return self._error


class ResponseSender:
    """Keeps what was sent: (response, flags) pairs."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, response=None, flags: int = 0) -> None:
        self.sent.append((response, flags))


class InferenceRequest:
    """A request as execute receives it: input tensors, a parameters JSON string, a timeout."""

    def __init__(self, inputs: Mapping[str, np.ndarray], parameters: str = "{}", timeout_us: int = 0) -> None:
        self._tensors = [Tensor(name, array) for name, array in inputs.items()]
        self._parameters = parameters
        self._timeout_us = timeout_us
        self._sender: Optional[ResponseSender] = None

    def inputs(self) -> List[Tensor]:
        return self._tensors

    def parameters(self) -> str:
        return self._parameters

    def timeout(self) -> int:
        return self._timeout_us

    def is_cancelled(self) -> bool:
        return False

    def get_response_sender(self) -> ResponseSender:
        if self._sender is None:
            self._sender = ResponseSender()
        return self._sender


class Logger:
    """Keeps the log lines, by level."""
    lines: list = []

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.lines.append(("info", message))

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.lines.append(("warn", message))

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.lines.append(("error", message))


class MetricFamily:
    COUNTER, GAUGE = "counter", "gauge"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: Mapping[str, str]) -> "MetricFamily":
        return self

    def increment(self, value: float) -> None:
        pass

    def set(self, value: float) -> None:
        pass


class StandinStub:
    """Stands for the triton_python_backend_utils module a LatteModel is given."""
    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    Tensor = Tensor
    TritonError = TritonError
    InferenceResponse = InferenceResponse
    Logger = Logger
    MetricFamily = MetricFamily


class TritonModelException(Exception):
    pass


def get_input_tensor_by_name(request, name: str) -> Optional[Tensor]:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response, name: str) -> Optional[Tensor]:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def _config_entry(model_config: Mapping, key: str, name: str) -> Optional[Mapping]:
    return next((t for t in model_config.get(key, []) if t.get("name") == name), None)


def get_input_config_by_name(model_config: Mapping, name: str) -> Optional[Mapping]:
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config: Mapping, name: str) -> Optional[Mapping]:
    return _config_entry(model_config, "output", name)


def triton_string_to_numpy(triton_type: str):
    from latte.backend.dtypes import to_numpy

    return to_numpy(triton_type).type


def standin_module():
    """A module that stands for triton_python_backend_utils where there is no stub (tests, a
    graph of steps run in this process): what a Python-backend model.py commonly uses of it."""
    import types

    module = types.ModuleType("triton_python_backend_utils", __doc__)
    for name in ("Tensor", "TritonError", "InferenceResponse", "Logger", "MetricFamily", "TritonModelException",
                 "get_input_tensor_by_name", "get_output_tensor_by_name", "get_input_config_by_name",
                 "get_output_config_by_name", "triton_string_to_numpy"):
        setattr(module, name, globals()[name])
    module.TRITONSERVER_RESPONSE_COMPLETE_FINAL = StandinStub.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    return module
