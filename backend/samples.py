"""Made-up input values, wherever latte needs inputs no client sent: the accuracy check of a
reduced-precision model, the warm-up data of generated configs, profiles and benchmark requests."""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np

from latte.backend.dtypes import is_string, to_numpy


def sample_values(dtype: Union[str, np.dtype, type], shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Values of `dtype` (a numpy dtype or a Triton type name such as TYPE_INT64) and `shape`:
    small positive integers, random booleans, standard normals, or for strings a few words of
    text (bytes, as Triton hands BYTES tensors to a model)."""
    dtype = to_numpy(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    shape = tuple(shape)
    if is_string(dtype):
        words = rng.integers(1, 1000, size=(int(np.prod(shape)), 1 + int(rng.integers(1, 16))))
        texts = [" ".join(f"w{n}" for n in row).encode() for row in words]
        return np.array(texts, dtype=object).reshape(shape)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        # Token-like ids, valid for most vocabularies; 0 is left out because models commonly
        # treat it as padding.
        return rng.integers(1, 100, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)
