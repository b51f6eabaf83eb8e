"""Shape buckets for ragged inputs: a request of length n is padded to the smallest edge >= n.

A few recurring shapes keep kernels, caches and arena blocks warm (and give the scheduler a
locality key), at the cost of padding; the default edges are powers of two up to the
model's maximum length, so padding wastes at most half of a batch's positions.
"""

from __future__ import annotations

import bisect
from typing import List, Optional, Sequence


class BucketPlan:
    def __init__(self, edges: Sequence[int]) -> None:
        edges = sorted(set(int(e) for e in edges))
        if not edges or edges[0] < 1:
            raise ValueError(f"bucket edges must be positive lengths, got {list(edges)}")
        self.edges: List[int] = edges

    @classmethod
    def default(cls, max_length: Optional[int]) -> Optional["BucketPlan"]:
        if not max_length:
            return None
        edges, edge = [], 16
        while edge < max_length:
            edges.append(edge)
            edge *= 2
        edges.append(max_length)
        return cls(edges)

    @classmethod
    def parse(cls, text: str) -> "BucketPlan":
        try:
            return cls([int(part) for part in text.split(",") if part.strip()])
        except ValueError:
            raise ValueError(f"bucket_edges must be comma-separated lengths such as '32,64,128', got {text!r}") from None

    def edge_for(self, length: int) -> int:
        """The bucket edge for `length`; lengths past the last edge keep their own length."""
        i = bisect.bisect_left(self.edges, length)
        return self.edges[i] if i < len(self.edges) else length
