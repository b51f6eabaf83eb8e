"""A tensor on its way through a graph of steps, for one batch: its rows, and for a ragged
tensor how far each row really reaches along its variable dimensions.

Rows stay padded between steps (one array a tensor, not one per request); a ragged tensor
carries each row's length, so the next model step can plan and pad it as it plans requests,
and the graph's outputs are trimmed once, at the end. Memory comes from the current resource (the
model's arena, memory_resource) wherever a step makes a new buffer. Between two torch steps of one device a
value is a torch tensor on that device (on a GPU it never leaves it); the helpers below that
model steps use (repadded, gather, scatter) take either.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from latte._native import row_lengths
from latte.backend import memory_resource
from latte.backend.batching import packed, pad_bytes
from latte.backend.dtypes import is_string


class Value:
    """One tensor of one batch. `axes`: the array's variable axes (the -1 dimensions its
    readers and writer declare, as array axes: 1 is the first after the rows), all padded to
    one length; `lengths`: each row's own length along them (None: every row is the full
    width); `pad`: what fills a row past its length."""

    __slots__ = ("array", "axes", "lengths", "pad")

    def __init__(self, array: np.ndarray, axes: Tuple[int, ...] = (), lengths: Optional[np.ndarray] = None,
                 pad: float = 0.0) -> None:
        self.array = array
        self.axes = axes
        self.lengths = lengths
        self.pad = pad

    @property
    def rows(self) -> int:
        return self.array.shape[0]

    @property
    def width(self) -> Optional[int]:
        """The padded length of the variable axes (None without any)."""
        return self.array.shape[self.axes[0]] if self.axes else None

    def row_lengths(self) -> Optional[np.ndarray]:
        """Each row's length along the variable axes; the full width where none was measured."""
        if not self.axes:
            return None
        if self.lengths is not None:
            return self.lengths
        return np.full(self.rows, self.width, dtype=np.int64)

    def __repr__(self) -> str:
        return f"Value({self.array.dtype}{list(self.array.shape)}, axes={self.axes}, ragged={self.lengths is not None})"


def is_tensor(array) -> bool:
    """Whether `array` is a torch tensor (one torch step hands to the next, on its device)."""
    return type(array).__module__.startswith("torch")


def host_dtype(array) -> np.dtype:
    """The numpy data type of an array or a torch tensor."""
    if is_tensor(array):
        import torch

        return torch.empty((), dtype=array.dtype).numpy().dtype
    return array.dtype


def on_host(value: "Value") -> "Value":
    """The value as numpy, for a step that does not take torch tensors (a copy from the device)."""
    if not is_tensor(value.array):
        return value
    return Value(value.array.detach().cpu().numpy(), value.axes, value.lengths, value.pad)


def variable_axes(dims: Sequence[int]) -> Tuple[int, ...]:
    """The array axes (rows first) of the -1 dimensions of a tensor declared with `dims`."""
    return tuple(1 + i for i, d in enumerate(dims) if d == -1)


def _window(axes: Tuple[int, ...], ndim: int, length: int) -> tuple:
    """An index that keeps every row and the first `length` positions of the variable axes."""
    index = [slice(None)] * ndim
    for axis in axes:
        index[axis] = slice(0, length)
    return tuple(index)


def repadded(value: Value, pad: float) -> np.ndarray:
    """The value's array with `pad` past every row's length: the array itself when its pad is
    that already (or nothing is padded), else a copy."""
    if value.lengths is None or value.pad == pad or not value.axes or is_string(host_dtype(value.array)):
        return value.array
    if is_tensor(value.array):
        import torch

        array = value.array
        out = array.clone()
        positions = torch.arange(value.width, device=array.device)
        beyond = positions[None, :] >= torch.as_tensor(value.lengths, device=array.device)[:, None]
        for axis in value.axes:
            shape = [1] * out.ndim
            shape[0], shape[axis] = out.shape[0], out.shape[axis]
            out.masked_fill_(beyond.reshape(shape), pad)
        return out
    out = memory_resource.empty(value.array.shape, value.array.dtype)
    out[...] = value.array
    positions = np.arange(value.width)
    beyond = positions[None, :] >= value.lengths[:, None]  # rows x width
    for axis in value.axes:
        shape = [1] * out.ndim
        shape[0], shape[axis] = out.shape[0], out.shape[axis]
        np.copyto(out, np.asarray(pad, dtype=out.dtype), where=beyond.reshape(shape))
    return out


def gather(array: np.ndarray, axes: Tuple[int, ...], rows: Optional[np.ndarray], length: Optional[int],
           ) -> np.ndarray:
    """The batch of `rows` (all, in order, when None) cut to `length` along the variable axes:
    a view where it can be one, else one copy into memory from the current resource."""
    source = array if length is None or not axes or length == array.shape[axes[0]] else array[_window(axes, array.ndim, length)]
    if rows is None:
        return source
    if is_tensor(array):
        import torch

        return source.index_select(0, torch.as_tensor(rows, device=array.device))
    if is_string(array.dtype):
        return source[rows]
    out = memory_resource.empty((len(rows), *source.shape[1:]), array.dtype)
    np.take(source, rows, axis=0, out=out)
    return out


def measure_lengths(array: np.ndarray, axes: Tuple[int, ...], pad: float) -> np.ndarray:
    """Each row's length along the variable axes of a padded array a Python step returned:
    how far its last value other than `pad` reaches (at least 1, since the row is there)."""
    if not axes or array.shape[0] == 0:
        return np.zeros(array.shape[0], dtype=np.int64)
    width = array.shape[axes[0]]
    if width == 0:
        return np.zeros(array.shape[0], dtype=np.int64)
    if axes == (1,) and array.dtype.kind in "biuf":
        # The common case, one variable dimension right after the rows: one native pass.
        return row_lengths(array, pad_bytes(pad, array.dtype))
    filled = array != np.asarray(pad, dtype=array.dtype)
    lengths = np.ones(array.shape[0], dtype=np.int64)
    for axis in axes:
        others = tuple(a for a in range(1, array.ndim) if a != axis)
        along = filled.any(axis=others) if others else filled  # rows x width
        reach = width - np.argmax(along[:, ::-1], axis=1)
        lengths = np.maximum(lengths, np.where(along.any(axis=1), reach, 1))
    return lengths


def stack_members(parts: Sequence[np.ndarray], axes: Tuple[int, ...], pad: float,
                  ) -> Value:
    """One value from each request's own array (a Python model step answers per request; a
    stream's start batch is made of its streams' inputs): rows one after another, variable
    axes padded to the longest by the one packing of batches (batching.packed), each row's
    length that of its request's array."""
    if not axes:
        return Value(parts[0] if len(parts) == 1 else np.concatenate(parts))
    first = parts[0]
    if is_string(first.dtype):
        raise TypeError("strings are not padded; a ragged output must be numeric")
    member_lengths = np.fromiter((part.shape[axes[0]] for part in parts), dtype=np.int64, count=len(parts))
    rows = [part.shape[0] for part in parts]
    shape = [sum(rows), *first.shape[1:]]
    for axis in axes:
        shape[axis] = int(member_lengths.max())
    out = packed(parts, tuple(shape), first.dtype, pad)
    return Value(out, axes, np.repeat(member_lengths, rows), pad)


def scatter(parts: Sequence[Tuple[np.ndarray, np.ndarray]], total: int, axes: Tuple[int, ...], pad: float,
            ) -> np.ndarray:
    """One array of `total` rows from (rows, array) parts that together cover every row once
    (the sub-batches a step's plan ran), variable axes padded to the widest part."""
    first = parts[0][1]
    shape = [total, *first.shape[1:]]
    if axes:
        width = max(part.shape[axes[0]] for _, part in parts)
        for axis in axes:
            shape[axis] = width
    if is_tensor(first):
        import torch

        out = torch.full(shape, pad, dtype=first.dtype, device=first.device) if axes else \
            torch.empty(shape, dtype=first.dtype, device=first.device)
        for rows, part in parts:
            index = torch.as_tensor(rows, device=first.device)
            if axes:
                out[(index,) + tuple(slice(0, n) for n in part.shape[1:])] = part
            else:
                out[index] = part
        return out
    if is_string(first.dtype):
        out = np.empty(tuple(shape), dtype=first.dtype)
    else:
        out = memory_resource.empty(tuple(shape), first.dtype)
        if axes:
            out.fill(pad)
    for rows, part in parts:
        if axes and part.shape[axes[0]] != shape[axes[0]]:
            index = (rows,) + tuple(slice(0, n) for n in part.shape[1:])
            out[index] = part
        else:
            out[rows] = part
    return out
