"""Turning the requests of one `execute` call into as few model calls as possible.

The stock Python backend runs requests one at a time even when Triton's dynamic
batcher hands it many; here every compatible request goes into one call and the
outputs are split back by rows. Ragged inputs are padded to their shape bucket's edge,
so the model sees a few recurring shapes; which requests share a batch is either their
bucket alone or, with a cost model, the cheapest plan (latte.backend.planning).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np

from latte.backend.buckets import BucketPlan
from latte.backend.config import ModelSpec
from latte.backend.planning import CostModel, plan_by_cost
from latte.backend.requests import ParsedRequest

Allocate = Callable[[tuple, np.dtype], np.ndarray]


@dataclass
class Batch:
    inputs: Dict[str, np.ndarray]
    members: List[Tuple[int, int]]        # (position in execute's request list, rows)
    lengths: List[Optional[int]]          # each member's own ragged length (None when not ragged)
    padded_length: Optional[int] = None   # the ragged length the batch was padded to

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.members)


def ragged_length(spec: ModelSpec, request: ParsedRequest) -> Optional[int]:
    """The longest variable dimension among the request's ragged inputs."""
    longest = None
    for t in spec.inputs:
        if not t.ragged or t.name not in request.inputs:
            continue
        inner = request.inputs[t.name].shape[1:]
        for size, dim in zip(inner, t.dims):
            if dim == -1:
                longest = size if longest is None else max(longest, size)
    return longest


def shape_key(spec: ModelSpec, request: ParsedRequest) -> Hashable:
    """Requests with equal keys can be padded into one batch: equal non-ragged inner shapes
    and ragged inputs of equal rank."""
    key = []
    for t in spec.inputs:
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


def _chunks(items: Sequence[Item], max_rows: int) -> List[List[Item]]:
    batches: List[List[Item]] = [[]]
    rows = 0
    for item in items:
        if batches[-1] and rows + item[1].rows > max_rows:
            batches.append([])
            rows = 0
        batches[-1].append(item)
        rows += item[1].rows
    return batches


def plan_batches(spec: ModelSpec, requests: Sequence[Item], buckets: Optional[BucketPlan] = None,
                 cost: Optional[CostModel] = None) -> List[List[Item]]:
    """Group (position, request) pairs into batches of compatible requests within max_batch_size.

    Without `cost` (or without buckets) a batch holds requests of one bucket. With it,
    requests of one shape key may share a batch across buckets, as the cost model's
    cheapest plan says; padding still goes to a bucket edge.
    """
    if not spec.batched:
        return [[item] for item in requests]
    planned = cost is not None and buckets is not None
    # Each request's length is found once: this runs for every execute call.
    groups: Dict[Hashable, List[Tuple[Item, Optional[int]]]] = {}
    for item in requests:
        length = ragged_length(spec, item[1])
        key = shape_key(spec, item[1])
        if not planned and length is not None and buckets is not None:
            key += (("bucket", buckets.edge_for(length)),)
        groups.setdefault(key, []).append((item, length))
    batches: List[List[Item]] = []
    for members in groups.values():
        items = [item for item, _ in members]
        lengths = [length for _, length in members]
        if not planned or None in lengths:
            batches.extend(_chunks(items, spec.max_batch_size))
            continue
        for indices in plan_by_cost(lengths, [req.rows for _, req in items], buckets.edge_for, cost,
                                    spec.max_batch_size):
            batches.append([items[i] for i in indices])
    return batches


def assemble(spec: ModelSpec, group: Sequence[Tuple[int, ParsedRequest]], buckets: Optional[BucketPlan] = None,
             allocate: Allocate = np.empty) -> Batch:
    members = [(pos, req.rows) for pos, req in group]
    lengths = [ragged_length(spec, req) for _, req in group]
    if not spec.batched:
        return Batch(inputs=dict(group[0][1].inputs), members=members, lengths=lengths)
    known = [n for n in lengths if n is not None]
    padded = None
    if known:
        padded = max(known)
        if buckets is not None:
            padded = buckets.edge_for(padded)
    inputs: Dict[str, np.ndarray] = {}
    for t in spec.inputs:
        parts = [req.inputs[t.name] for _, req in group if t.name in req.inputs]
        if not parts:
            continue
        rows = sum(p.shape[0] for p in parts)
        if t.ragged:
            inner = tuple(padded if dim == -1 else size for size, dim in zip(parts[0].shape[1:], t.dims))
            out = allocate((rows, *inner), t.dtype)
            out.fill(spec.pad_value)
            at = 0
            for p in parts:
                out[(slice(at, at + p.shape[0]),) + tuple(slice(0, s) for s in p.shape[1:])] = p
                at += p.shape[0]
        elif len(parts) == 1:
            out = parts[0]
        else:
            out = allocate((rows, *parts[0].shape[1:]), t.dtype)
            np.concatenate(parts, axis=0, out=out)
        inputs[t.name] = out
    return Batch(inputs=inputs, members=members, lengths=lengths, padded_length=padded)


def split(spec: ModelSpec, batch: Batch, outputs: Dict[str, np.ndarray]) -> List[Dict[str, np.ndarray]]:
    """Per-request outputs, in the order of batch.members.

    An output dimension declared -1 whose size equals the padded length is cut back to
    each request's own length, so per-token outputs come back un-padded.
    """
    if not spec.batched:
        return [outputs]
    total = batch.rows
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise RuntimeError(f"output {name!r} has shape {list(array.shape)}; expected {total} rows for this batch")
    declared = {t.name: t.dims for t in spec.outputs}
    results = []
    at = 0
    for (_, rows), length in zip(batch.members, batch.lengths):
        per_request = {}
        for name, array in outputs.items():
            index = [slice(at, at + rows)]
            for size, dim in zip(array.shape[1:], declared.get(name, ())):
                trim = dim == -1 and length is not None and size == batch.padded_length
                index.append(slice(0, length) if trim else slice(None))
            per_request[name] = array[tuple(index)]
        results.append(per_request)
        at += rows
    return results
