"""Where the streams' state lives: pools carved from the model's arena at load, their blocks
counted from free lists, never searched (vLLM's block pool).

- StatePool: one slot per live stream, a row of each fixed-size state tensor.
- BlockPool: a growing state (a key/value cache) in blocks of `block_rows` rows; a stream
  takes a block when its last is full, and gives all back when it ends.

A step reads the live streams' state gathered into one batch (one indexing call per tensor)
and its outputs are written back the same way.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np

from latte.backend import memory_resource
from latte.backend.errors import ModelError, OutOfMemory



class ShortOfBlocks(OutOfMemory):
    """The pool has fewer free blocks than asked for."""


class _FreeList:
    def __init__(self, count: int, first: int = 0) -> None:
        self.capacity = count
        self._free = list(range(first + count - 1, first - 1, -1))  # popped lowest first

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def taken(self) -> int:
        return self.capacity - len(self._free)

    def take(self, count: int, what: str, kept: int = 0) -> List[int]:
        """`count` ids, leaving at least `kept` free."""
        if count + kept > len(self._free):
            raise ShortOfBlocks(f"{what}: {count} needed, {len(self._free)} of {self.capacity} free"
                                + (f", {kept} kept for the running streams' next rows" if kept else ""))
        taken = self._free[len(self._free) - count:][::-1]
        del self._free[len(self._free) - count:]
        return taken

    def give_back(self, ids: Sequence[int]) -> None:
        self._free.extend(reversed(ids))


class StatePool:
    """`slots` rows of each state tensor (name -> (dims, dtype)), one slot per stream."""

    def __init__(self, slots: int, tensors: Dict[str, Tuple[Tuple[int, ...], np.dtype]]) -> None:
        self.arrays = {name: memory_resource.empty((slots, *dims), np.dtype(dtype))
                       for name, (dims, dtype) in tensors.items()}
        self._slots = _FreeList(slots)
        self.row_bytes = sum(a[0].nbytes for a in self.arrays.values())

    @property
    def taken(self) -> int:
        return self._slots.taken

    @property
    def capacity(self) -> int:
        return self._slots.capacity

    def take(self) -> int:
        return self._slots.take(1, "stream state slots")[0]

    def give_back(self, slot: int) -> None:
        self._slots.give_back([slot])

    def gather(self, slots: np.ndarray) -> Dict[str, np.ndarray]:
        return {name: array[slots] for name, array in self.arrays.items()}

    def write_row(self, slot: int, rows: Dict[str, np.ndarray], made_by: str) -> None:
        """One stream's row of each state tensor; a row of another shape (numpy would broadcast
        some) is refused before any is written."""
        for name, array in self.arrays.items():
            if rows[name].shape != array.shape[1:]:
                raise ModelError(f"{made_by} made {name!r} of shape {list(rows[name].shape)} for a stream; its "
                                 f"state holds {list(array.shape[1:])}")
        for name, array in self.arrays.items():
            array[slot] = rows[name]

    def write(self, slots: np.ndarray, values: Dict[str, np.ndarray], made_by: str = "the step") -> None:
        """Each state tensor's rows at `slots`; a value of another shape (numpy would broadcast
        some) is refused before any is written."""
        for name, array in self.arrays.items():
            if values[name].shape != (len(slots), *array.shape[1:]):
                raise ModelError(f"{made_by} made the next {name!r} of shape {list(values[name].shape)} for "
                                 f"{len(slots)} streams; their state holds {[len(slots), *array.shape[1:]]}")
        for name, array in self.arrays.items():
            array[slots] = values[name]


class BlockPool:
    """`blocks` blocks of `block_rows` rows of `row_dims`; block 0 is all zeros, the padding a
    gathered batch reads past each stream's end (so a masked-away row is finite)."""

    def __init__(self, blocks: int, block_rows: int, row_dims: Tuple[int, ...], dtype) -> None:
        self.block_rows = block_rows
        self.array = memory_resource.empty((blocks + 1, block_rows, *row_dims), np.dtype(dtype))
        self.array[...] = 0  # rows a stream has not written are read masked, never as NaN
        self._blocks = _FreeList(blocks, first=1)
        self.block_bytes = self.array[0].nbytes

    @property
    def taken(self) -> int:
        return self._blocks.taken

    @property
    def free(self) -> int:
        return self._blocks.free

    @property
    def capacity(self) -> int:
        return self._blocks.capacity

    def blocks_for(self, rows: int) -> int:
        return -(-rows // self.block_rows)

    def take(self, count: int, kept: int = 0) -> List[int]:
        """`count` blocks, leaving at least `kept` free."""
        return self._blocks.take(count, "cache blocks", kept)

    def give_back(self, ids: Sequence[int]) -> None:
        self._blocks.give_back(ids)

    def write_rows(self, ids: Sequence[int], rows: np.ndarray) -> None:
        """A stream's first `len(rows)` rows, into its blocks `ids`."""
        count, size = len(rows), self.block_rows
        full = count // size
        if full:
            self.array[ids[:full]] = rows[:full * size].reshape(full, size, *rows.shape[1:])
        if count > full * size:
            self.array[ids[full], :count - full * size] = rows[full * size:]

    def append(self, blocks: np.ndarray, offsets: np.ndarray, rows: np.ndarray, made_by: str = "the step") -> None:
        """Row i of `rows` at offset offsets[i] of block blocks[i]."""
        if rows.shape != (len(blocks), *self.array.shape[2:]):
            raise ModelError(f"{made_by} made a cache row of shape {list(rows.shape)} for {len(blocks)} streams; "
                             f"the cache holds rows of {list(self.array.shape[2:])}")
        self.array[blocks, offsets] = rows

    def gather(self, tables: np.ndarray) -> np.ndarray:
        """tables [streams, blocks] (0 past a stream's last block) -> [streams, blocks * block_rows, ...row]."""
        gathered = self.array[tables]
        return gathered.reshape(tables.shape[0], tables.shape[1] * self.block_rows, *self.array.shape[2:])
