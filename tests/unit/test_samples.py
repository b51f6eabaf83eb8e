"""Made-up input values: what the accuracy check, generated warm-up data and benchmarks feed."""

import numpy as np
import pytest

from latte.backend.samples import sample_values


def test_integer_samples_are_small_positive_ids_never_the_padding_zero():
    values = sample_values("TYPE_INT64", (4, 256), np.random.default_rng(0))
    assert values.dtype == np.int64 and values.shape == (4, 256)
    assert values.min() >= 1 and values.max() < 100


@pytest.mark.parametrize("dtype, expected", [
    ("TYPE_FP16", np.float16), (np.float32, np.float32), ("TYPE_BOOL", np.bool_), (np.dtype(np.uint8), np.uint8),
])
def test_samples_take_a_triton_type_name_or_a_numpy_dtype(dtype, expected):
    values = sample_values(dtype, [3, 2], np.random.default_rng(0))
    assert values.dtype == expected and values.shape == (3, 2)


def test_one_seed_gives_one_set_of_values():
    first = sample_values("TYPE_FP32", (8,), np.random.default_rng(7))
    np.testing.assert_array_equal(first, sample_values(np.float32, (8,), np.random.default_rng(7)))
    assert first.std() > 0  # random normals, not a constant


def test_a_type_latte_cannot_serve_is_named():
    with pytest.raises(ValueError, match="TYPE_BF16 is not supported by the latte backend"):
        sample_values("TYPE_BF16", (1,), np.random.default_rng(0))


def test_strings_are_words_of_text_as_bytes():
    texts = sample_values("TYPE_STRING", (3, 1), np.random.default_rng(0))
    assert texts.dtype == object and texts.shape == (3, 1)
    assert all(isinstance(t, bytes) and t.split() for t in texts.reshape(-1))
