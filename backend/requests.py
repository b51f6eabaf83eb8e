"""Reading one Triton request into checked numpy arrays.

Works on any object with `inputs()` returning tensors that have `name()` and
`as_numpy()` (what the Python backend's stub gives), so it is testable without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Mapping

import numpy as np

from latte.backend.config import ModelSpec, TensorSpec
from latte.backend.dtypes import NUMPY_TO_TRITON, wire_name


class RequestError(ValueError):
    """This request cannot be served; the message says what was wrong and what was expected."""


class RequestCancelled(RuntimeError):
    """The client gave up on the request before it ran."""


@dataclass
class ParsedRequest:
    inputs: Dict[str, np.ndarray]
    rows: int                                  # batch rows this request contributes (1 when unbatched)
    parameters: Mapping[str, object] = field(default_factory=dict)
    timeout_us: int = 0                        # Triton's own request timeout, 0 = none


def _dtype_name(dtype: np.dtype) -> str:
    key = NUMPY_TO_TRITON.get(np.dtype(dtype))
    return wire_name(key) if key else str(dtype)


def _shape_matches(shape, dims) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims))


class RequestReader:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._by_name = {t.name: t for t in spec.inputs}

    def read(self, request) -> ParsedRequest:
        arrays: Dict[str, np.ndarray] = {}
        for tensor in request.inputs():
            name = tensor.name()
            if name not in self._by_name:
                raise RequestError(
                    f"unexpected input {name!r}; model {self.spec.name!r} takes {sorted(self._by_name)}"
                )
            arrays[name] = tensor.as_numpy()
        missing = [t.name for t in self.spec.inputs if t.name not in arrays and not t.optional]
        if missing:
            raise RequestError(f"missing input(s) {missing}; model {self.spec.name!r} takes {sorted(self._by_name)}")
        rows = None
        for name, array in arrays.items():
            spec = self._by_name[name]
            self._check(spec, array)
            r = int(array.shape[0]) if self.spec.batched else 1
            if rows is None:
                rows = r
            elif r != rows:
                raise RequestError(f"inputs disagree on the batch size: {name!r} has {r} rows, others {rows}")
        timeout = getattr(request, "timeout", None)
        return ParsedRequest(inputs=arrays, rows=rows or 1, parameters=_parameters(request),
                             timeout_us=int(timeout()) if timeout is not None else 0)

    def _check(self, spec: TensorSpec, array: np.ndarray) -> None:
        if array.dtype != spec.dtype:
            raise RequestError(
                f"input {spec.name!r}: expected data type {_dtype_name(spec.dtype)}, got {_dtype_name(array.dtype)}"
            )
        shape = tuple(array.shape)
        if self.spec.batched:
            if len(shape) == 0 or not _shape_matches(shape[1:], spec.dims):
                raise RequestError(
                    f"input {spec.name!r}: expected shape {spec.shape_text(True)}, got {list(shape)}"
                )
            if shape[0] < 1 or shape[0] > self.spec.max_batch_size:
                raise RequestError(
                    f"input {spec.name!r}: batch of {shape[0]} rows; this model takes 1 to "
                    f"{self.spec.max_batch_size} rows per request"
                )
            inner = shape[1:]
        else:
            if not _shape_matches(shape, spec.dims):
                raise RequestError(f"input {spec.name!r}: expected shape {spec.shape_text(False)}, got {list(shape)}")
            inner = shape
        limit = self.spec.max_sequence_length
        if limit is not None:
            for size, dim in zip(inner, spec.dims):
                if dim == -1 and size > limit:
                    raise RequestError(
                        f"input {spec.name!r}: length {size} exceeds this model's maximum of {limit}"
                    )
        if any(size == 0 for size in inner):
            raise RequestError(f"input {spec.name!r}: empty dimension in shape {list(shape)}")
        if self.spec.reject_nan and array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = np.argwhere(~np.isfinite(array))[0].tolist()
            raise RequestError(
                f"input {spec.name!r}: NaN or infinity at index {bad}; this model only takes finite values"
            )


def _parameters(request) -> Mapping[str, object]:
    getter = getattr(request, "parameters", None)
    if getter is None:
        return {}
    raw = getter()
    if not raw:
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except (ValueError, TypeError):
        raise RequestError(f"request parameters are not valid JSON: {raw!r}") from None
    return value if isinstance(value, dict) else {}


def describe_inputs(spec: ModelSpec) -> List[str]:
    return [f"{t.name}: {_dtype_name(t.dtype)} {t.shape_text(spec.batched)}" for t in spec.inputs]
