"""The fewest rows a batch needs for each row's result not to depend on how many rows share it.

A BLAS library picks its kernel by the rows of a product (MKL: a matrix-vector kernel for one
row, another for two or three), and the kernels sum in different orders. Measured on the
example recurrent decoder: a stream's hidden state after one step at batch 1 differs from its
state at batch 16 in the seventh digit, and of 16 streams of 64 greedy tokens run together,
none equalled its run alone (they parted after 6 to 61 tokens). A batch padded up to that
count with copies of its first row gives a stream the same tokens whoever shares its batch.
"""

from __future__ import annotations

from typing import Callable, Dict

import numpy as np

PROBE_ROWS = 8         # the fewest rows a probe compares
PROBE_MOST_ROWS = 64   # and the most: max_streams past it are assumed to agree (a probe's load time)


def fewest_invariant_rows(run: Callable[[int], Dict[str, np.ndarray]], probe_rows: int = PROBE_ROWS) -> int:
    """`run(k)`: the outputs of the probe's first k rows, run as one batch. The smallest n for
    which every batch of n to `probe_rows` rows gives each of its rows the bits the whole probe
    gives that row."""
    whole = run(probe_rows)
    fewest = probe_rows
    for rows in range(probe_rows - 1, 0, -1):
        part = run(rows)
        if not all(_same_bits(part[name][:rows], whole[name][:rows]) for name in whole):
            break
        fewest = rows
    return fewest


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bits, not values: a NaN made from made-up state equals itself here."""
    if a.dtype == object or b.dtype == object:
        return np.array_equal(a, b)
    return a.shape == b.shape and a.dtype == b.dtype and \
        np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def probe_feed(tensors: Dict[str, tuple], rows: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """Made-up inputs of `rows` rows for tensors {name: (dims, dtype)}: seeded normal values
    for floating-point ones (rows that differ), zeros for the rest (an index 0 is valid)."""
    rng = np.random.default_rng(seed)
    feed = {}
    for name, (dims, dtype) in tensors.items():
        dtype = np.dtype(dtype)
        shape = (rows, *dims)
        feed[name] = (rng.standard_normal(shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                      else np.zeros(shape, dtype=dtype))
    return feed
