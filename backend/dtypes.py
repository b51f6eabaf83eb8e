"""Triton data types <-> numpy dtypes."""

from __future__ import annotations

import numpy as np

TRITON_TO_NUMPY = {
    "TYPE_BOOL": np.dtype(np.bool_),
    "TYPE_UINT8": np.dtype(np.uint8),
    "TYPE_UINT16": np.dtype(np.uint16),
    "TYPE_UINT32": np.dtype(np.uint32),
    "TYPE_UINT64": np.dtype(np.uint64),
    "TYPE_INT8": np.dtype(np.int8),
    "TYPE_INT16": np.dtype(np.int16),
    "TYPE_INT32": np.dtype(np.int32),
    "TYPE_INT64": np.dtype(np.int64),
    "TYPE_FP16": np.dtype(np.float16),
    "TYPE_FP32": np.dtype(np.float32),
    "TYPE_FP64": np.dtype(np.float64),
}
NUMPY_TO_TRITON = {v: k for k, v in TRITON_TO_NUMPY.items()}
# Every type a Triton config may declare: latte's runtimes serve those above; a Python-backend
# step of a generated pipeline may also take strings and bfloat16.
TRITON_TYPES = tuple(TRITON_TO_NUMPY) + ("TYPE_BF16", "TYPE_STRING")


def to_numpy(triton_type: str) -> np.dtype:
    try:
        return TRITON_TO_NUMPY[triton_type]
    except KeyError:
        raise ValueError(
            f"data type {triton_type} is not supported by the latte backend "
            f"(supported: {', '.join(sorted(TRITON_TO_NUMPY))})"
        ) from None


def to_triton(dtype) -> str:
    dtype = np.dtype(dtype)
    try:
        return NUMPY_TO_TRITON[dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no Triton equivalent") from None


def wire_name(triton_type: str) -> str:
    """The name used on the wire and by tritonclient (TYPE_FP32 -> FP32)."""
    return triton_type[len("TYPE_"):]
