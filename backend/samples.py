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


def encode_sample(array: np.ndarray):
    """One request's input as JSON: nested lists of numbers, or for strings (bytes that need not
    be text) {"b64": [each element in base64], "shape": [...]}."""
    import base64

    array = np.asarray(array)
    if not is_string(array.dtype):
        return array.tolist()
    return {"b64": [base64.b64encode(bytes(v)).decode() for v in array.reshape(-1)], "shape": list(array.shape)}


def decode_sample(value, dtype: np.dtype) -> np.ndarray:
    """encode_sample's JSON back as an array of `dtype` (text given as plain strings is UTF-8)."""
    import base64

    if isinstance(value, dict):
        elements = [base64.b64decode(v) for v in value["b64"]]
        return np.array(elements, dtype=object).reshape(value["shape"])
    if is_string(dtype):
        encoded = np.asarray(value, dtype=object)
        return np.array([v.encode() if isinstance(v, str) else bytes(v) for v in encoded.reshape(-1)],
                        dtype=object).reshape(encoded.shape)
    return np.asarray(value, dtype=dtype)
