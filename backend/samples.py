"""Made-up input values, wherever latte needs inputs no client sent: the accuracy check of a
reduced-precision model, the warm-up data of generated configs, profiles and benchmark requests."""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from latte.backend.dtypes import to_numpy


def sample_values(dtype: Union[str, np.dtype, type], shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Values of `dtype` (a numpy dtype or a Triton type name such as TYPE_INT64) and `shape`:
    small positive integers, random booleans, or standard normals."""
    dtype = to_numpy(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    shape = tuple(shape)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        # Token-like ids, valid for most vocabularies; 0 is left out because models commonly
        # treat it as padding.
        return rng.integers(1, 100, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)
