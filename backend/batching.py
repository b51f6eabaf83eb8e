"""Turning the requests of one `execute` call into as few model calls as possible.

The stock Python backend runs requests one at a time even when Triton's dynamic
batcher hands it many; here every compatible request goes into one call and the
outputs are split back by rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Hashable, List, Sequence, Tuple

import numpy as np

from latte.backend.config import ModelSpec
from latte.backend.requests import ParsedRequest


@dataclass
class Batch:
    inputs: Dict[str, np.ndarray]
    members: List[Tuple[int, int]]   # (position in execute's request list, rows)

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.members)


def _compat_key(spec: ModelSpec, request: ParsedRequest) -> Hashable:
    # Requests batch together when every non-ragged input agrees on its inner shape;
    # ragged inputs are padded, so only their rank matters.
    key = []
    for t in spec.inputs:
        array = request.inputs.get(t.name)
        if array is None:
            key.append((t.name, None))
            continue
        inner = array.shape[1:]
        key.append((t.name, len(inner) if t.ragged else tuple(inner)))
    return tuple(key)


def plan_batches(spec: ModelSpec, requests: Sequence[Tuple[int, ParsedRequest]]) -> List[List[Tuple[int, ParsedRequest]]]:
    """Group (position, request) pairs into batches of compatible requests within max_batch_size."""
    if not spec.batched:
        return [[item] for item in requests]
    groups: Dict[Hashable, List[List[Tuple[int, ParsedRequest]]]] = {}
    order: List[Hashable] = []
    for item in requests:
        key = _compat_key(spec, item[1])
        if key not in groups:
            groups[key] = [[]]
            order.append(key)
        current = groups[key][-1]
        if current and sum(r.rows for _, r in current) + item[1].rows > spec.max_batch_size:
            current = []
            groups[key].append(current)
        current.append(item)
    return [batch for key in order for batch in groups[key]]


def assemble(spec: ModelSpec, group: Sequence[Tuple[int, ParsedRequest]]) -> Batch:
    members = [(pos, req.rows) for pos, req in group]
    if not spec.batched:
        return Batch(inputs=dict(group[0][1].inputs), members=members)
    inputs: Dict[str, np.ndarray] = {}
    for t in spec.inputs:
        parts = [req.inputs[t.name] for _, req in group if t.name in req.inputs]
        if not parts:
            continue
        if len(parts) == 1:
            inputs[t.name] = parts[0]
            continue
        if t.ragged:
            inner = np.max([p.shape[1:] for p in parts], axis=0)
            rows = sum(p.shape[0] for p in parts)
            out = np.full((rows, *inner), spec.pad_value, dtype=t.dtype)
            at = 0
            for p in parts:
                index = (slice(at, at + p.shape[0]),) + tuple(slice(0, s) for s in p.shape[1:])
                out[index] = p
                at += p.shape[0]
            inputs[t.name] = out
        else:
            inputs[t.name] = np.concatenate(parts, axis=0)
    return Batch(inputs=inputs, members=members)


def split(spec: ModelSpec, batch: Batch, outputs: Dict[str, np.ndarray]) -> List[Dict[str, np.ndarray]]:
    """Per-request outputs, in the order of batch.members."""
    if not spec.batched:
        return [outputs]
    total = batch.rows
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise RuntimeError(
                f"output {name!r} has shape {list(array.shape)}; expected {total} rows for this batch"
            )
    results = []
    at = 0
    for _, rows in batch.members:
        results.append({name: array[at:at + rows] for name, array in outputs.items()})
        at += rows
    return results
