"""Building Triton responses; `pb` is the stub's triton_python_backend_utils, passed in."""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from latte.backend.config import ConfigError
from latte.backend.engine import DeadlineExceeded, ModelError
from latte.backend.requests import RequestCancelled, RequestError


class ResponseBuilder:
    def __init__(self, pb, output_names) -> None:
        self.pb = pb
        self.output_names = list(output_names)

    def success(self, outputs: Dict[str, np.ndarray]):
        # The stub's Tensor makes a non-contiguous array contiguous itself.
        tensors = [self.pb.Tensor(name, outputs[name]) for name in self.output_names]
        return self.pb.InferenceResponse(output_tensors=tensors)

    def build_all(self, outcomes: Sequence, answered: Sequence[bool]) -> List:
        """execute's return value: a response per outcome, None where the request was
        already answered through its sender. One loop, since it runs for every request."""
        Tensor, Response = self.pb.Tensor, self.pb.InferenceResponse
        names = self.output_names
        single = names[0] if len(names) == 1 else None
        responses = []
        for done, outcome in zip(answered, outcomes):
            if done:
                responses.append(None)
            elif isinstance(outcome, Exception):
                responses.append(self.error(outcome))
            else:
                try:
                    tensors = ([Tensor(single, outcome[single])] if single is not None
                               else [Tensor(name, outcome[name]) for name in names])
                    responses.append(Response(output_tensors=tensors))
                except Exception as exc:  # an output Triton cannot carry fails this request alone
                    responses.append(self.error(RuntimeError(f"could not build the response: {exc}")))
        return responses

    def error(self, exc: Exception):
        return self.pb.InferenceResponse(output_tensors=[], error=self.triton_error(exc))

    def triton_error(self, exc: Exception):
        TritonError = self.pb.TritonError
        code = None
        if isinstance(exc, (RequestError, ConfigError)):
            code = getattr(TritonError, "INVALID_ARG", None)
        elif isinstance(exc, MemoryError):
            code = getattr(TritonError, "UNAVAILABLE", None)
        elif isinstance(exc, RequestCancelled):
            code = getattr(TritonError, "CANCELLED", None)
        elif isinstance(exc, DeadlineExceeded):
            code = getattr(TritonError, "DEADLINE_EXCEEDED", getattr(TritonError, "UNAVAILABLE", None))
        elif isinstance(exc, ModelError):
            code = getattr(TritonError, "INTERNAL", None)
        message = str(exc) or type(exc).__name__
        if code is None:
            return TritonError(message)
        return TritonError(message, code)

    def build(self, outcome):
        if isinstance(outcome, Exception):
            return self.error(outcome)
        return self.success(outcome)
