"""Reading the requests of one `execute` call into checked numpy arrays.

Works on any object with `inputs()` returning tensors that have `name()` and
`as_numpy()` (what the Python backend's stub gives), so it is testable without it.

Per request, Python does only what the stub's API forces: fetch the input tensors, their
numpy views, the parameters string and the timeout. The checks against the config (data
type, shape, rows, length limit, empty dimensions, non-finite values) run natively, one
call per input for the whole `execute` call (latte._native.inspect_arrays); only a request
that fails one gets its message worded here.
"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np

from latte._native import BATCH_PROBLEMS, InputRule, inspect_arrays
from latte.backend.config import ModelSpec, TensorSpec
from latte.backend.dtypes import NUMPY_TO_TRITON, wire_name
from latte.backend.errors import RequestCancelled, RequestError

# The length of a request not yet measured (ParsedRequest.length); None means no ragged input.
UNMEASURED = -1
NO_PARAMETERS: Mapping[str, object] = MappingProxyType({})


class ParsedRequest:
    """One readable request: its input arrays, the batch rows it brings (1 when unbatched),
    its parameters, Triton's own timeout (us, 0 = none) and its longest ragged dimension
    (measured once by the reader; None when the model has no ragged input). One is made
    per request, hence the slots."""

    __slots__ = ("inputs", "rows", "parameters", "timeout_us", "length")

    def __init__(self, inputs: Dict[str, np.ndarray], rows: int, parameters: Mapping[str, object] = NO_PARAMETERS,
                 timeout_us: int = 0, length: Optional[int] = UNMEASURED) -> None:
        self.inputs = inputs
        self.rows = rows
        self.parameters = parameters
        self.timeout_us = timeout_us
        self.length = length

    def __repr__(self) -> str:
        shapes = {name: list(array.shape) for name, array in self.inputs.items()}
        return f"ParsedRequest(inputs={shapes}, rows={self.rows}, parameters={dict(self.parameters)})"


def _dtype_name(dtype: np.dtype) -> str:
    key = NUMPY_TO_TRITON.get(np.dtype(dtype))
    return wire_name(key) if key else str(dtype)


def _float_bits(dtype: np.dtype) -> int:
    return dtype.itemsize * 8 if dtype.kind == "f" else 0


def _rule(spec: ModelSpec, t: TensorSpec) -> InputRule:
    low, high = t.valid_range or (0, 0)
    return InputRule(type=t.dtype.num, float_bits=_float_bits(t.dtype), dims=list(t.dims),
                     batched=spec.signature.batched, max_rows=max(spec.signature.max_batch_size, 1),
                     max_length=spec.serving.max_sequence_length or 0,
                     reject_nonfinite=spec.serving.reject_nan, int_bits=t.dtype.itemsize * 8 if t.valid_range else 0,
                     int_signed=t.dtype.kind == "i", low=low, high=high)


class CallRead(NamedTuple):
    """An execute call's requests as read: one entry per request (a ParsedRequest, or the
    exception that says why it cannot be served); `plain` when every one is readable and
    carries no parameters and no timeout (all run with the default options); `rows`, the
    call's rows when plain."""
    items: List[Union[ParsedRequest, Exception]]
    plain: bool
    rows: int


class Columns(NamedTuple):
    """A plain call read by input: each input's arrays in the order of the requests, the
    rows each request brings and, for a model with ragged inputs, each request's longest
    variable dimension across them (None for a model without)."""
    arrays: Dict[str, List[np.ndarray]]
    rows: List[int]
    lengths: Optional[List[int]] = None


class RequestReader:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._by_name = {t.name: t for t in spec.signature.inputs}
        self._required = [t.name for t in spec.signature.inputs if not t.optional]
        self._rules = {t.name: _rule(spec, t) for t in spec.signature.inputs}
        self._names = set(self._by_name)
        self._order = [t.name for t in spec.signature.inputs]

    def read_columns(self, requests: Sequence) -> Optional[Columns]:
        """The call's arrays by input when it is plain: every request sends every input once,
        no parameters and no timeout, and passes every check. None otherwise: read_call then
        reads the call again and words each request's refusal.

        No per-request object is made, which is most of what reading costs a small model.
        """
        count = len(self._order)
        columns: Dict[str, List[np.ndarray]] = {name: [] for name in self._order}
        if count == 1:
            (name,) = self._order
            arrays = columns[name]
            append = arrays.append
            for request in requests:
                tensors = request.inputs()
                if len(tensors) != 1:
                    return None
                tensor = tensors[0]
                if tensor.name() != name:
                    return None
                append(tensor.as_numpy())
                raw = request.parameters()
                if (raw and raw != "{}") or request.timeout() > 0:
                    return None
        else:
            get = columns.get
            for request in requests:
                tensors = request.inputs()
                if len(tensors) != count:
                    return None
                for tensor in tensors:
                    column = get(tensor.name())
                    if column is None:
                        return None
                    column.append(tensor.as_numpy())
                raw = request.parameters()
                if (raw and raw != "{}") or request.timeout() > 0:
                    return None
        return self._inspected(columns, len(requests))

    def _inspected(self, columns: Dict[str, List[np.ndarray]], count: int) -> Optional[Columns]:
        """The call's columns once every input of every request passed its native check."""
        rows = lengths = None
        for name in self._order:
            arrays = columns[name]
            if len(arrays) != count:  # one input sent twice, another not at all
                return None
            found, longest, problems = inspect_arrays(self._rules[name], arrays)
            if problems or (rows is not None and found != rows):
                return None
            rows = found
            if self._by_name[name].ragged:
                lengths = longest if lengths is None else [max(a, b) for a, b in zip(lengths, longest)]
        if lengths and min(lengths) < 0:  # ragged inputs without a variable dimension: nothing to plan by
            lengths = None
        return Columns(columns, rows if rows is not None else [], lengths)

    def read(self, request) -> ParsedRequest:
        """One request, checked; raises RequestError when it cannot be served."""
        (item,) = self.read_all([request])
        if isinstance(item, Exception):
            raise item
        return item

    def read_all(self, requests: Sequence, check_cancellation: bool = False) -> List[Union[ParsedRequest, Exception]]:
        """One entry per request: its checked inputs, or the exception that says why not."""
        return self.read_call(requests, check_cancellation).items

    def read_call(self, requests: Sequence, check_cancellation: bool = False) -> "CallRead":
        """The call's requests, read and checked, with what the rest of the call needs to know
        about them as a whole."""
        items: List[Union[ParsedRequest, Exception]] = []
        names = self._names
        every = True     # every request readable so far, each with every input
        defaults = True  # and none with parameters or a timeout
        for request in requests:
            try:
                # Each is_cancelled() is a round trip to the server; Triton itself already drops
                # requests cancelled while queued, so the check is opt-in.
                if check_cancellation and request.is_cancelled():
                    raise RequestCancelled("the client cancelled this request before it ran")
                arrays = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
                if arrays.keys() != names:  # rare: an unexpected, missing or optional input
                    every = False
                    self._check_names(arrays)
                raw = request.parameters()
                timeout_us = request.timeout()
                if not raw or raw == "{}":
                    parameters = NO_PARAMETERS
                else:
                    parameters = _parameters(raw)
                    defaults = defaults and parameters is NO_PARAMETERS
                if timeout_us > 0:
                    defaults = False
                items.append(ParsedRequest(arrays, 0, parameters, timeout_us, None))
            except (RequestError, RequestCancelled) as exc:
                every = False
                items.append(exc)
            except Exception as exc:  # a reader bug must still answer this request alone
                every = False
                items.append(RequestError(f"could not read request: {type(exc).__name__}: {exc}"))
        rows = self._check(items, every)
        return CallRead(items, defaults and rows is not None, rows or 0)

    def _check_names(self, arrays: Mapping[str, np.ndarray]) -> None:
        unexpected = [name for name in arrays if name not in self._by_name]
        if unexpected:
            raise RequestError(f"unexpected input {unexpected[0]!r}; model {self.spec.signature.name!r} "
                               f"takes {sorted(self._by_name)}")
        missing = [name for name in self._required if name not in arrays]
        if missing:
            raise RequestError(f"missing input(s) {missing}; model {self.spec.signature.name!r} "
                               f"takes {sorted(self._by_name)}")

    def _check(self, items: List[Union[ParsedRequest, Exception]], every: bool = False) -> Optional[int]:
        """Fill in rows and length of every readable request; replace the refused ones with
        their RequestError. `every`: each item is a ParsedRequest holding every input.
        The call's rows when every request passed, else None."""
        complete = every
        total = None
        inputs = self.spec.signature.inputs
        first = inputs[0] if inputs else None
        for spec in inputs:
            name = spec.name
            if every:
                positions = range(len(items))
                arrays = [item.inputs[name] for item in items]
            else:
                positions = [i for i, item in enumerate(items) if type(item) is ParsedRequest and name in item.inputs]
                if not positions:
                    continue
                arrays = [items[i].inputs[name] for i in positions]
            rows, lengths, problems = inspect_arrays(self._rules[name], arrays)
            if total is None and every and not problems:
                total = sum(rows)
            for index, problem, detail in problems:
                i = positions[index]
                items[i] = RequestError(self._message(spec, items[i].inputs[name], BATCH_PROBLEMS[problem], detail))
                every = False  # the next input's arrays are the readable requests' only
            if every and total is not None and spec is first:
                # The common case, the first input of requests that all passed: each gets its rows.
                for item, r, n in zip(items, rows, lengths):
                    item.rows, item.length = r, (n if spec.ragged else item.length)
                continue
            every = _merge_rows(items, positions, rows, lengths, spec) and every
        if complete:
            return total if every else None  # every request sent every input: each has its rows
        for item in items:
            if type(item) is ParsedRequest and item.rows == 0:
                item.rows = 1  # only optional inputs were sent, and none of them
        return None

    def _message(self, spec: TensorSpec, array: np.ndarray, problem: str, detail: int) -> str:
        shape = list(array.shape)
        if problem == "dtype":
            return f"input {spec.name!r}: expected data type {_dtype_name(spec.dtype)}, got {_dtype_name(array.dtype)}"
        if problem == "shape":
            return f"input {spec.name!r}: expected shape {spec.shape_text(self.spec.signature.batched)}, got {shape}"
        if problem == "rows":
            return (f"input {spec.name!r}: batch of {detail} rows; this model takes 1 to "
                    f"{self.spec.signature.max_batch_size} rows per request")
        if problem == "too_long":
            return (f"input {spec.name!r}: length {detail} exceeds this model's maximum of "
                    f"{self.spec.serving.max_sequence_length}")
        if problem == "empty":
            return f"input {spec.name!r}: empty dimension in shape {shape}"
        if problem == "nonfinite":
            index = np.unravel_index(detail, array.shape)
            return (f"input {spec.name!r}: NaN or infinity at index {[int(i) for i in index]}; "
                    f"this model only takes finite values")
        if problem == "out_of_range":
            index = np.unravel_index(detail, array.shape)
            low, high = spec.valid_range
            return (f"input {spec.name!r}: value {array[index]} at index {[int(i) for i in index]} is outside "
                    f"this model's valid range {low}..{high}")
        return f"input {spec.name!r}: refused ({problem})"


def _parameters(raw) -> Mapping[str, object]:
    """A request's parameters from the JSON text the stub gives (or a mapping)."""
    try:
        value = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except (ValueError, TypeError):
        raise RequestError(f"request parameters are not valid JSON: {raw!r}") from None
    return value if isinstance(value, dict) and value else NO_PARAMETERS


def _merge_rows(items, positions, rows, lengths, spec: TensorSpec) -> bool:
    """Each readable request's rows and length as one more of its inputs measured them;
    False when an input disagrees with another on the rows (that request is refused)."""
    agreed = True
    for i, r, n in zip(positions, rows, lengths):
        item = items[i]
        if type(item) is not ParsedRequest:
            continue  # refused just above
        if item.rows == 0:  # the first of its inputs checked
            item.rows = r
            item.length = n if spec.ragged else None
        elif r != item.rows:
            items[i] = RequestError(f"inputs disagree on the batch size: {spec.name!r} has {r} rows, "
                                    f"others {item.rows}")
            agreed = False
        elif spec.ragged and (item.length is None or n > item.length):
            item.length = n
    return agreed
