"""Turning the requests of one `execute` call into as few model calls as possible.

The stock Python backend runs requests one at a time even when Triton's dynamic
batcher hands it many; here every compatible request goes into one call and the
outputs are split back by rows. Ragged inputs are padded to the batch's longest member
(`pad_to: longest`, the default) or to its shape bucket's edge (`pad_to: edge`, so the model
sees a few recurring shapes, as TensorRT's profiles want); which requests share a batch is
either their bucket alone or, with a cost model, the cheapest plan (latte.backend.planning).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np

from latte.backend.buckets import BucketPlan
from latte.backend.config import ModelSpec
from latte.backend import memory_resource
from latte.backend.dtypes import is_string
from latte._native import pack_arrays
from latte.backend.planning import CostModel, plan_by_cost
from latte.backend.requests import UNMEASURED, ParsedRequest



@dataclass
class Batch:
    """One model call's inputs. A row's length has one representation on the whole path, here,
    in a graph's values (graph/values.py) and in what a runtime answers (Runtime.run_batch):
    each row's own length along the variable dimensions, an int64 array (`lengths`), None
    when every row is the full width. (A request's length, the longest of its rows, is what
    the reader measures and the planner plans by: ParsedRequest.length, or Call.lengths for a
    call read by input.)"""
    inputs: Dict[str, np.ndarray]
    member_rows: List[int]                          # each member's rows, in the order of the requests
    lengths: Optional[np.ndarray] = None            # each row's own ragged length; None: nothing ragged
    padded_length: Optional[int] = None             # the ragged length the batch was padded to
    rows: int = 0                                   # all members' rows together


def row_lengths(lengths: Sequence[Optional[int]], member_rows: Sequence[int], padded: int) -> np.ndarray:
    """Each row's length from each member's (a member without a ragged input is the full
    `padded` width)."""
    if len(lengths) == sum(member_rows):
        return np.array(lengths if None not in lengths else [padded if n is None else n for n in lengths],
                        dtype=np.int64)
    return np.repeat(np.array([padded if n is None else n for n in lengths], dtype=np.int64), member_rows)


def member_lengths(lengths: Sequence[int], member_rows: Sequence[int]) -> List[int]:
    """Each member's length from each row's: the longest of its rows'."""
    if len(member_rows) == len(lengths):
        return list(lengths)
    ends = np.cumsum(member_rows)
    return [int(max(lengths[end - rows:end])) if rows else 0 for rows, end in zip(member_rows, ends)]


def ragged_length(spec: ModelSpec, request: ParsedRequest) -> Optional[int]:
    """The longest variable dimension among the request's ragged inputs (as the reader
    measured it, or measured here for requests made otherwise: warmup, sessions)."""
    if request.length != UNMEASURED:
        return request.length
    longest = None
    for t in spec.signature.inputs:
        if not t.ragged or t.name not in request.inputs:
            continue
        inner = request.inputs[t.name].shape[1:]
        for size, dim in zip(inner, t.dims):
            if dim == -1:
                longest = size if longest is None else max(longest, size)
    request.length = longest
    return longest


def uniform_shapes(spec: ModelSpec) -> bool:
    """Whether every checked request has the same shape key: every input always sent, and
    only ragged inputs with variable dimensions (whose rank the reader fixes)."""
    return all(not t.optional and (t.ragged or -1 not in t.dims) for t in spec.signature.inputs)


def shape_key(spec: ModelSpec, request: ParsedRequest) -> Hashable:
    """Requests with equal keys can be padded into one batch: equal non-ragged inner shapes
    and ragged inputs of equal rank."""
    key = []
    for t in spec.signature.inputs:
        array = request.inputs.get(t.name)
        if array is None:
            key.append((t.name, None))
        elif t.ragged:
            key.append((t.name, array.ndim))
        else:
            key.append((t.name, tuple(array.shape[1:])))
    return tuple(key)


def affinity_key(spec: ModelSpec, request: ParsedRequest, buckets: Optional[BucketPlan],
                 edge: Optional[int] = None) -> Hashable:
    """The shape key plus, for ragged inputs, the bucket edge the request is padded to: its
    own bucket's, or `edge` when a plan put it in a batch of a larger bucket."""
    key = shape_key(spec, request)
    if edge is None:
        length = ragged_length(spec, request)
        if length is not None and buckets is not None:
            edge = buckets.edge_for(length)
    if edge is not None:
        key += (("bucket", edge),)
    return key


Item = Tuple[int, ParsedRequest]


def chunk_by_rows(items: Sequence, rows: Sequence[int], max_rows: int) -> List[List]:
    """Consecutive runs of `items` holding at most max_rows rows each (rows[i] is item i's)."""
    if not items:
        return []
    if sum(rows) <= max_rows:  # the common call: all of it is one batch
        return [list(items)]
    batches: List[List] = [[]]
    taken = 0
    for item, r in zip(items, rows):
        if batches[-1] and taken + r > max_rows:
            batches.append([])
            taken = 0
        batches[-1].append(item)
        taken += r
    return batches


def plan_batches(spec: ModelSpec, requests: Sequence[Item], buckets: Optional[BucketPlan] = None,
                 cost: Optional[CostModel] = None) -> List[List[Item]]:
    """Group (position, request) pairs into batches of compatible requests within max_batch_size:
    requests of one shape key, planned by plan_rows."""
    if not spec.signature.batched:
        return [[item] for item in requests]
    # Each request's length is found once: this runs for every execute call.
    groups: Dict[Hashable, List[Tuple[Item, Optional[int]]]] = {}
    keyed = not uniform_shapes(spec)
    for item in requests:
        groups.setdefault(shape_key(spec, item[1]) if keyed else (), []).append((item, ragged_length(spec, item[1])))
    batches: List[List[Item]] = []
    for members in groups.values():
        items = [item for item, _ in members]
        lengths = [length for _, length in members]
        for indices in plan_rows(spec, [req.rows for _, req in items], None if None in lengths else lengths,
                                 buckets, cost):
            batches.append([items[i] for i in indices])
    return batches


def plan_rows(spec: ModelSpec, rows: Sequence[int], lengths: Optional[Sequence[int]],
              buckets: Optional[BucketPlan] = None, cost: Optional[CostModel] = None) -> List[List[int]]:
    """Indices of requests of one shape key (`rows` and ragged `lengths` each) grouped into
    batches within max_batch_size. Without lengths, consecutive runs. Without `cost` (or
    without buckets) a batch holds requests of one bucket; with it, requests may share a
    batch across buckets, as the cost model's cheapest plan says, padded to the batch's
    longest member or its bucket's edge (pad_to)."""
    max_rows = spec.signature.max_batch_size
    if lengths is None or buckets is None:
        return chunk_by_rows(list(range(len(rows))), rows, max_rows)
    if cost is None:
        by_edge: Dict[int, List[int]] = {}
        for i, length in enumerate(lengths):
            by_edge.setdefault(buckets.edge_for(length), []).append(i)
        return [batch for members in by_edge.values()
                for batch in chunk_by_rows(members, [rows[i] for i in members], max_rows)]
    padded_to = buckets.edge_for if spec.serving.pad_to == "edge" else _own_length
    return plan_by_cost(lengths, rows, padded_to, cost, max_rows)


def _own_length(length: int) -> int:
    """What a batch whose longest member has `length` is padded to, with pad_to: longest."""
    return length


def assemble(spec: ModelSpec, group: Sequence[ParsedRequest], buckets: Optional[BucketPlan] = None,
             ) -> Batch:
    """The requests of one planned batch as the model's inputs: one native copy per input."""
    ragged = spec.signature.ragged_inputs
    if len(group) == 1 and not ragged:
        # One request's own arrays are the batch (a ragged one may still need padding
        # between its inputs, below).
        rows = group[0].rows
        return Batch(inputs=group[0].inputs, member_rows=[rows], rows=rows)
    member_rows = [req.rows for req in group]
    if not spec.signature.batched:  # one request's own arrays, answered whole
        return Batch(inputs=group[0].inputs, member_rows=member_rows, rows=sum(member_rows))
    lengths = [ragged_length(spec, req) for req in group] if ragged else None
    columns = {t.name: [req.inputs[t.name] for req in group if t.name in req.inputs] for t in spec.signature.inputs}
    return assemble_columns(spec, columns, member_rows, lengths, buckets)


def assemble_columns(spec: ModelSpec, columns: Dict[str, List[np.ndarray]], member_rows: List[int],
                     lengths: Optional[List[Optional[int]]], buckets: Optional[BucketPlan] = None,
                     ) -> Batch:
    """One batch of a batched model from its members' arrays by input (an optional input
    lists only the members that sent it): one native copy per input, ragged inputs padded
    to the longest member (or, with pad_to: edge, its bucket's edge). `lengths`: each
    member's ragged length, or None when no member has one."""
    if lengths is None and len(member_rows) == 1:  # one request, nothing ragged: its own arrays
        return Batch(inputs={name: parts[0] for name, parts in columns.items() if parts},
                     member_rows=member_rows, rows=member_rows[0])
    total = sum(member_rows)
    padded = None
    known = [n for n in lengths if n is not None] if lengths is not None and spec.signature.ragged_inputs else None
    if known:
        padded = max(known)
        # A request alone in its batch runs at its own length, as it would one at a time:
        # padding it to its bucket's edge buys no batching.
        if buckets is not None and len(member_rows) > 1 and spec.serving.pad_to == "edge":
            padded = buckets.edge_for(padded)
    inputs: Dict[str, np.ndarray] = {}
    for t in spec.signature.inputs:
        parts = columns.get(t.name)
        if not parts:
            continue
        rows = total if len(parts) == len(member_rows) else sum(p.shape[0] for p in parts)
        if t.ragged:
            inner = tuple(padded if dim == -1 else size for size, dim in zip(parts[0].shape[1:], t.dims))
            if len(parts) == 1 and inner == parts[0].shape[1:]:
                out = parts[0]  # a request alone at its own length: nothing to pad
            else:
                # One native copy of every part, the padding written around them.
                out = packed(parts, (rows, *inner), t.dtype, spec.serving.pad_value)
        elif len(parts) == 1:
            out = parts[0]
        else:
            out = packed(parts, (rows, *parts[0].shape[1:]), t.dtype, spec.serving.pad_value)
        inputs[t.name] = out
    return Batch(inputs=inputs, member_rows=member_rows, rows=total, padded_length=padded,
                 lengths=row_lengths(lengths, member_rows, padded) if padded is not None else None)


def packed(parts: Sequence[np.ndarray], shape: tuple, dtype: np.dtype, pad_value: float,
           ) -> np.ndarray:
    """`parts` one after another along the rows in a new array of `shape`, each padded to it:
    one native copy (~4x np.concatenate's speed) into memory from the current resource
    (memory_resource). Strings hold
    references, which a byte copy would not count and the arena must not keep: they are
    concatenated by numpy (they are never padded; the config refuses ragged strings)."""
    if is_string(dtype):
        return np.concatenate(parts)
    out = memory_resource.empty(shape, dtype)
    pack_arrays(parts, out, pad_bytes(pad_value, dtype))
    return out


_PAD_BYTES: Dict[Tuple[float, np.dtype], bytes] = {}


def pad_bytes(value: float, dtype: np.dtype) -> bytes:
    """One element of `dtype` holding the pad value, as pack_arrays takes it."""
    key = (value, dtype)
    cached = _PAD_BYTES.get(key)
    if cached is None:
        cached = _PAD_BYTES[key] = np.array(value).astype(dtype).tobytes()
    return cached


def conform_outputs(outputs: Dict[str, np.ndarray], dtypes: Optional[Dict[str, np.dtype]],
                    rows: Optional[int]) -> Dict[str, np.ndarray]:
    """A model call's outputs as the model declares them: each output of a declared type
    (`dtypes`) a numpy array of that type (a framework's tensor, or another type, converted), and
    each one `rows` rows long (None: the model does not batch). Raises when rows are missing,
    naming the output."""
    for name, array in outputs.items():
        dtype = None if dtypes is None else dtypes.get(name)
        if dtype is not None and (type(array) is not np.ndarray or (array.dtype is not dtype and array.dtype != dtype)):
            array = outputs[name] = np.asarray(array, dtype=dtype)
        if rows is not None and (array.ndim == 0 or array.shape[0] != rows):
            raise RuntimeError(f"output {name!r} has shape {list(array.shape)}; expected {rows} rows for this batch")
    return outputs


def split(spec: ModelSpec, batch: Batch, outputs: Dict[str, np.ndarray],
          own: Optional[Dict[str, Sequence[int]]] = None) -> List[Dict[str, np.ndarray]]:
    """Per-request outputs, in the order of the batch's requests.

    A ragged output is cut to each request's own length: the longest of its rows' lengths the
    runtime says (`own`, each row's, as a graph of steps says it), else, for an output
    dimension declared -1 whose size equals the padded length, the request's own input length,
    so per-token outputs come back un-padded.
    """
    if not spec.signature.batched:
        return [outputs]
    if own or (spec.signature.trimmed_outputs and batch.padded_length is not None):
        return _trimmed(spec, batch, outputs, own)
    return row_views(outputs, batch.member_rows)


def row_views(outputs: Dict[str, np.ndarray], member_rows: Sequence[int]) -> List[Dict[str, np.ndarray]]:
    """Each request's share of a batch's outputs with nothing to trim: views of its rows."""
    if len(member_rows) == 1:
        return [outputs]
    if sum(member_rows) == len(member_rows):  # the batch runner checked every output has these rows
        # One row each: numpy hands out the row views itself.
        names = list(outputs)
        columns = [outputs[name][:, None] for name in names]
        if len(names) == 1:
            return [{names[0]: view} for view in columns[0]]
        return [dict(zip(names, views)) for views in zip(*columns)]
    results = []
    at = 0
    for rows in member_rows:
        results.append({name: array[at:at + rows] for name, array in outputs.items()})
        at += rows
    return results


def _trimmed(spec: ModelSpec, batch: Batch, outputs: Dict[str, np.ndarray],
             own: Optional[Dict[str, Sequence[int]]]) -> List[Dict[str, np.ndarray]]:
    """Each request's rows of every output, its ragged dimensions cut to its own length."""
    declared = {t.name: t.dims for t in spec.signature.outputs}
    own = {name: member_lengths(cut, batch.member_rows) for name, cut in own.items()} if own else None
    lengths = member_lengths(batch.lengths, batch.member_rows) if batch.lengths is not None \
        else [None] * len(batch.member_rows)
    results = []
    at = 0
    for member, (rows, length) in enumerate(zip(batch.member_rows, lengths)):
        per_request = {}
        for name, array in outputs.items():
            index = [slice(at, at + rows)]
            cut = own.get(name) if own else None
            for size, dim in zip(array.shape[1:], declared.get(name, ())):
                if cut is not None:
                    index.append(slice(0, cut[member]) if dim == -1 else slice(None))
                    continue
                trim = dim == -1 and length is not None and size == batch.padded_length
                index.append(slice(0, length) if trim else slice(None))
            per_request[name] = array[tuple(index)]
        results.append(per_request)
        at += rows
    return results
