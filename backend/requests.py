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
import traceback
from types import MappingProxyType
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from latte._native import BATCH_PROBLEMS, InputRule, inspect_arrays
from latte.backend.config import ModelSpec, TensorSpec
from latte.backend.dtypes import NUMPY_TO_TRITON, wire_name
from latte.backend.errors import ModelError, RequestCancelled, RequestError
from latte.backend.options import call_options

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


class Call:
    """One execute call's requests as the reader built them.

    A plain call (every request readable, none with parameters or a timeout) of a model
    whose requests all have one shape key is read by input: `arrays`, each input's arrays in
    the order of the requests, `rows` each request brings and, for ragged inputs, `lengths`,
    each request's longest variable dimension across them (None for a model without); no
    per-request object. Any other call is read request by request: `items`, a ParsedRequest
    or the exception that says why it cannot be served, with each one's `options` (None
    when every request runs with the defaults). One is made per call and read on every
    stage, hence the slots."""

    __slots__ = ("count", "items", "options", "arrays", "rows", "lengths")

    def __init__(self, count: int, items: Optional[List[Union[ParsedRequest, Exception]]] = None,
                 options: Optional[list] = None, arrays: Optional[Dict[str, List[np.ndarray]]] = None,
                 rows: Optional[List[int]] = None, lengths: Optional[List[int]] = None) -> None:
        self.count = count
        self.items = items
        self.options = options
        self.arrays = arrays
        self.rows = rows
        self.lengths = lengths

    def requests(self, members: Sequence[int]) -> List[ParsedRequest]:
        """The requests at `members`, each as it would be read alone."""
        if self.items is not None:
            return [self.items[i] for i in members]
        lengths = self.lengths
        return [ParsedRequest({name: arrays[i] for name, arrays in self.arrays.items()}, self.rows[i],
                              length=lengths[i] if lengths is not None else None)
                for i in members]


def requests_call(items: Sequence[Union[ParsedRequest, Exception]], options: Optional[list] = None) -> Call:
    """A call of requests read already (warm-up's, a tool's, a test's)."""
    return Call(len(items), list(items), options)


class RequestReader:
    def __init__(self, spec: ModelSpec, by_columns: bool = False, check_cancellation: bool = False) -> None:
        self.spec = spec
        # Each is_cancelled() is a round trip to the server; Triton itself already drops
        # requests cancelled while queued, so the check is opt-in.
        self.check_cancellation = check_cancellation
        # read_call(requests) -> Call: a plain call by input where the model reads calls so (every
        # request of the model has one shape key, and the call's batches run inline: the model
        # decides), any other call request by request. Chosen once here, not on every call.
        self.read_call = self._read_by_input if by_columns and not check_cancellation else self._read_by_request
        self._by_name = {t.name: t for t in spec.signature.inputs}
        self._required = [t.name for t in spec.signature.inputs if not t.optional]
        self._rules = {t.name: _rule(spec, t) for t in spec.signature.inputs}
        self._names = set(self._by_name)
        self._order = [t.name for t in spec.signature.inputs]

    def _read_by_input(self, requests: Sequence) -> Call:
        try:
            return self._read_columns(requests)
        except Exception:  # a fault reading some tensor: read alone, that request is answered alone
            return self._read_by_request(requests)

    def _read_columns(self, requests: Sequence) -> Call:
        """The call's arrays by input when it is plain: every request sends every input once,
        no parameters and no timeout, and passes every check. Any other call is read request
        by request, which words each request's refusal.

        No per-request object is made, which is most of what reading costs a small model.
        """
        count = len(self._order)
        columns: Dict[str, List[np.ndarray]] = {name: [] for name in self._order}
        if count == 1:
            (name,) = self._order
            append = columns[name].append
            for request in requests:
                tensors = request.inputs()
                if len(tensors) != 1 or tensors[0].name() != name:
                    return self._read_by_request(requests)
                append(tensors[0].as_numpy())
                raw = request.parameters()
                if (raw and raw != "{}") or request.timeout() > 0:
                    return self._read_by_request(requests)
        else:
            get = columns.get
            for request in requests:
                tensors = request.inputs()
                if len(tensors) != count:
                    return self._read_by_request(requests)
                for tensor in tensors:
                    column = get(tensor.name())
                    if column is None:
                        return self._read_by_request(requests)
                    column.append(tensor.as_numpy())
                raw = request.parameters()
                if (raw and raw != "{}") or request.timeout() > 0:
                    return self._read_by_request(requests)
        return self._inspected(columns, requests)

    def _inspected(self, columns: Dict[str, List[np.ndarray]], requests: Sequence) -> Call:
        """The call read by input, once every input of every request passed its native check;
        else read request by request."""
        rows = lengths = None
        count = len(requests)
        for name in self._order:
            arrays = columns[name]
            if len(arrays) != count:  # one input sent twice, another not at all
                return self._read_by_request(requests)
            found, longest, problems = inspect_arrays(self._rules[name], arrays)
            if problems or (rows is not None and found != rows):
                return self._read_by_request(requests)
            rows = found
            if self._by_name[name].ragged:
                lengths = longest if lengths is None else [max(a, b) for a, b in zip(lengths, longest)]
        if lengths and min(lengths) < 0:  # ragged inputs without a variable dimension: nothing to plan by
            lengths = None
        return Call(count, None, None, columns, rows if rows is not None else [], lengths)

    def _read_by_request(self, requests: Sequence) -> Call:
        """The call's requests read one by one, with each request's options."""
        items, defaults = self._read_items(requests, self.check_cancellation)
        return Call(len(items), items, None if defaults else call_options(items))

    def read_all(self, requests: Sequence) -> List[Union[ParsedRequest, Exception]]:
        """One entry per request: its checked inputs, or the exception that says why not."""
        return self._read_items(requests, self.check_cancellation)[0]

    def _read_items(self, requests: Sequence, check_cancellation: bool):
        """Each request read and checked, and whether every one runs with the default options
        (no parameters, no timeout)."""
        items: List[Union[ParsedRequest, Exception]] = []
        names = self._names
        every = True     # every request readable so far, each with every input
        defaults = True  # and none with parameters or a timeout
        for request in requests:
            try:
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
            except Exception as exc:  # a fault of the stub's or the reader's: this request alone, as internal
                every = False
                items.append(ModelError(f"model {self.spec.signature.name!r} could not read the request: "
                                        f"{type(exc).__name__}: {exc}",
                                        detail="".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))
        self._check(items, every)
        return items, defaults

    def _check_names(self, arrays: Mapping[str, np.ndarray]) -> None:
        unexpected = [name for name in arrays if name not in self._by_name]
        if unexpected:
            raise RequestError(f"unexpected input {unexpected[0]!r}; model {self.spec.signature.name!r} "
                               f"takes {sorted(self._by_name)}")
        missing = [name for name in self._required if name not in arrays]
        if missing:
            raise RequestError(f"missing input(s) {missing}; model {self.spec.signature.name!r} "
                               f"takes {sorted(self._by_name)}")

    def _check(self, items: List[Union[ParsedRequest, Exception]], every: bool = False) -> None:
        """Fill in rows and length of every readable request; replace the refused ones with
        their RequestError. `every`: each item is a ParsedRequest holding every input."""
        complete = every
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
            if every and not problems and spec is first:
                # The common case, the first input of requests that all passed: each gets its rows.
                for item, r, n in zip(items, rows, lengths):
                    item.rows, item.length = r, (n if spec.ragged else item.length)
                continue
            for index, problem, detail in problems:
                i = positions[index]
                items[i] = RequestError(self._message(spec, items[i].inputs[name], BATCH_PROBLEMS[problem], detail))
                every = False  # the next input's arrays are the readable requests' only
            every = _merge_rows(items, positions, rows, lengths, spec) and every
        if complete:
            return  # every request sent every input: each has its rows
        for item in items:
            if type(item) is ParsedRequest and item.rows == 0:
                item.rows = 1  # only optional inputs were sent, and none of them

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
