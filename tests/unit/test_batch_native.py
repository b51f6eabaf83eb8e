"""The native per-call checks and packing, as the request reader and batch assembler use them."""

import numpy as np
import pytest

from latte._native import BATCH_PROBLEMS, InputRule, inspect_arrays, pack_arrays
from latte.backend.batching import pad_bytes

TOKENS = InputRule(type=np.dtype(np.int64).num, float_bits=0, dims=[-1], batched=True, max_rows=4,
                   max_length=16, reject_nonfinite=False)


def test_one_call_checks_every_request_and_names_each_refusal():
    arrays = [np.ones((1, 5), np.int64), np.ones((1, 3), np.int32), np.ones((2, 17), np.int64),
              np.ones((5, 2), np.int64), np.ones((1, 0), np.int64), np.ones((3, 9), np.int64)]
    rows, lengths, problems = inspect_arrays(TOKENS, arrays)
    assert rows[0] == 1 and lengths[0] == 5
    assert rows[5] == 3 and lengths[5] == 9
    named = {index: (BATCH_PROBLEMS[problem], detail) for index, problem, detail in problems}
    assert named == {1: ("dtype", 0), 2: ("too_long", 17), 3: ("rows", 5), 4: ("empty", 0)}


def test_arrays_numpy_would_copy_are_checked_as_their_values():
    strided = np.arange(40, dtype=np.int64).reshape(2, 20)[:, ::4]  # (2, 5), not contiguous
    swapped = np.ones((1, 4), dtype=">i8")
    longlong = np.ones((1, 4), dtype=np.longlong)  # another type number for int64 on Linux
    rows, lengths, problems = inspect_arrays(TOKENS, [strided, swapped, longlong])
    assert problems == []
    assert rows == [2, 1, 1] and lengths == [5, 4, 4]


def test_non_finite_values_are_refused_only_when_the_rule_says_so():
    features = np.ones((2, 3), np.float32)
    features[1, 2] = np.inf
    allow = InputRule(type=np.dtype(np.float32).num, float_bits=32, dims=[3], batched=True, max_rows=8,
                      max_length=0, reject_nonfinite=False)
    refuse = InputRule(type=np.dtype(np.float32).num, float_bits=32, dims=[3], batched=True, max_rows=8,
                       max_length=0, reject_nonfinite=True)
    assert inspect_arrays(allow, [features])[2] == []
    assert inspect_arrays(refuse, [features])[2] == [(0, BATCH_PROBLEMS.index("nonfinite"), 5)]


def test_packing_pads_ragged_rows_and_equals_numpy():
    rng = np.random.default_rng(7)
    parts = [rng.integers(1, 100, size=(r, n), dtype=np.int64) for r, n in ((1, 3), (2, 7), (1, 1))]
    out = np.full((4, 8), -1, np.int64)
    pack_arrays(parts, out, pad_bytes(0.0, np.dtype(np.int64)))
    expected = np.zeros((4, 8), np.int64)
    at = 0
    for p in parts:
        expected[at:at + p.shape[0], :p.shape[1]] = p
        at += p.shape[0]
    np.testing.assert_array_equal(out, expected)


def test_packing_fixed_shapes_is_a_concatenation():
    parts = [np.full((r, 2, 3), r, np.float32) for r in (1, 3, 2)]
    out = np.empty((6, 2, 3), np.float32)
    pack_arrays(parts, out, pad_bytes(0.0, np.dtype(np.float32)))
    np.testing.assert_array_equal(out, np.concatenate(parts))


def test_packing_refuses_what_would_overrun_the_batch():
    out = np.zeros((1, 4), np.int64)
    with pytest.raises(ValueError, match="larger than out"):
        pack_arrays([np.ones((1, 5), np.int64)], out, pad_bytes(0.0, np.dtype(np.int64)))
    with pytest.raises(ValueError, match="data type differs"):
        pack_arrays([np.ones((1, 4), np.int32)], out, pad_bytes(0.0, np.dtype(np.int64)))


def test_packing_refuses_arrays_of_python_objects():
    out = np.empty((2, 1), object)
    with pytest.raises(ValueError, match="arrays of Python objects hold references"):
        pack_arrays([np.array([[b"a"]], object), np.array([[b"b"]], object)], out, b"\0" * out.itemsize)


def test_strings_are_concatenated_not_packed():
    from latte.backend import memory_resource
    from latte.backend.batching import packed

    def refuses(shape, dtype):  # the arena must not hold references to Python objects
        raise AssertionError("strings were packed into the arena")

    parts = [np.array([[b"one"]], object), np.array([[b"two"], [b"three"]], object)]
    memory_resource.use(refuses)
    try:
        out = packed(parts, (3, 1), np.dtype(object), 0.0)
    finally:
        memory_resource.release(refuses)
    assert out.tolist() == [[b"one"], [b"two"], [b"three"]]
