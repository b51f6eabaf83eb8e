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
# Strings (Triton's BYTES) arrive as numpy object arrays of bytes: a model reads and answers
# them (a text pipeline's first step tokenizes them), but they are never padded, packed
# natively or held in the arena, whose memory holds no Python references.
STRING = np.dtype(object)
SERVED_TYPES = {**TRITON_TO_NUMPY, "TYPE_STRING": STRING}
NUMPY_TO_TRITON = {v: k for k, v in SERVED_TYPES.items()}
# Every type a Triton config may declare: latte serves those above; a Python-backend model of a
# generated repository may also take bfloat16.
TRITON_TYPES = tuple(SERVED_TYPES) + ("TYPE_BF16",)


def to_numpy(triton_type: str) -> np.dtype:
    try:
        return SERVED_TYPES[triton_type]
    except KeyError:
        raise ValueError(
            f"data type {triton_type} is not supported by the latte backend "
            f"(supported: {', '.join(sorted(SERVED_TYPES))})"
        ) from None


def is_string(dtype: np.dtype) -> bool:
    return dtype.kind == "O"


def to_triton(dtype) -> str:
    dtype = np.dtype(dtype)
    try:
        return NUMPY_TO_TRITON[dtype]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no Triton equivalent") from None


def wire_name(triton_type: str) -> str:
    """The name used on the wire and by tritonclient (TYPE_FP32 -> FP32, TYPE_STRING -> BYTES)."""
    return "BYTES" if triton_type == "TYPE_STRING" else triton_type[len("TYPE_"):]
