"""Synthetic requests run at load, one per shape bucket, before the model reports ready."""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from latte.backend.config import ModelSpec
from latte.backend.requests import ParsedRequest


def warmup_requests(spec: ModelSpec) -> List[ParsedRequest]:
    lengths = list(spec.bucket_edges or ()) or [spec.max_sequence_length or 8]
    rows = max(1, spec.max_batch_size) if spec.batched else 1
    requests = []
    for length in lengths if any(t.ragged for t in spec.inputs) else lengths[:1]:
        feed: Dict[str, np.ndarray] = {}
        for t in spec.inputs:
            if t.optional:
                continue
            inner = tuple(length if d == -1 else d for d in t.dims)
            shape = ((rows,) if spec.batched else ()) + inner
            # Ones, not zeros: zero is the usual padding value and may be masked away.
            feed[t.name] = np.ones(shape, dtype=t.dtype)
        requests.append(ParsedRequest(inputs=feed, rows=rows))
    return requests


def warmup_shapes(spec: ModelSpec) -> List[Dict[str, tuple]]:
    return [{name: array.shape for name, array in r.inputs.items()} for r in warmup_requests(spec)]
