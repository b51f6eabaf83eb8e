"""The request reader on objects shaped like the stub's requests (inputs() -> tensors)."""

import numpy as np
import pytest

from latte.backend.config import ModelSignature, ModelSpec, ServingOptions, TensorSpec
from latte.backend.errors import RequestError
from latte.backend.requests import RequestReader


class Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, array

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class Request:
    def __init__(self, parameters="", **arrays):
        self._tensors = [Tensor(k, v) for k, v in arrays.items()]
        self._parameters = parameters

    def inputs(self):
        return self._tensors

    def parameters(self):
        return self._parameters

    def timeout(self):
        return 0


SPEC = ModelSpec(
    ModelSignature(name="seq", inputs=(TensorSpec("tokens", np.dtype(np.int64), (-1,), ragged=True),
                                       TensorSpec("scale", np.dtype(np.float32), (1,))),
                   outputs=(TensorSpec("embedding", np.dtype(np.float32), (32,)),), max_batch_size=4,
                   runtime="onnx", model_path=None),
    ServingOptions(max_sequence_length=16),
)


def read_one(reader, request):
    """The one request read and checked, or its refusal raised."""
    (item,) = reader.read_all([request])
    if isinstance(item, Exception):
        raise item
    return item


def good(rows=2, length=5):
    return Request(tokens=np.ones((rows, length), np.int64), scale=np.ones((rows, 1), np.float32))


def test_a_good_request_is_read_with_its_rows_and_parameters():
    request = good(rows=3)
    request._parameters = '{"priority": 2}'
    parsed = read_one(RequestReader(SPEC), request)
    assert parsed.rows == 3
    assert parsed.inputs["tokens"].shape == (3, 5)
    assert parsed.parameters == {"priority": 2}


@pytest.mark.parametrize("request_, message", [
    (Request(tokens=np.ones((1, 5), np.int32), scale=np.ones((1, 1), np.float32)),
     "input 'tokens': expected data type INT64, got INT32"),
    (Request(tokens=np.ones((1, 5), np.int64), scale=np.ones((1, 2), np.float32)),
     r"input 'scale': expected shape \[-1, 1\], got \[1, 2\]"),
    (Request(tokens=np.ones((1, 5), np.int64)), r"missing input\(s\) \['scale'\]"),
    (Request(tokens=np.ones((1, 5), np.int64), scale=np.ones((1, 1), np.float32), extra=np.ones(1)),
     "unexpected input 'extra'"),
    (good(rows=5), "batch of 5 rows; this model takes 1 to 4 rows"),
    (good(length=17), "length 17 exceeds this model's maximum of 16"),
    (Request(tokens=np.ones((2, 5), np.int64), scale=np.ones((1, 1), np.float32)), "disagree on the batch size"),
    (Request(parameters="{not json", tokens=np.ones((1, 5), np.int64), scale=np.ones((1, 1), np.float32)),
     "not valid JSON"),
])
def test_bad_requests_say_what_was_wrong_and_what_was_expected(request_, message):
    with pytest.raises(RequestError, match=message):
        read_one(RequestReader(SPEC), request_)


def test_nan_is_refused_where_the_model_forbids_it():
    from dataclasses import replace

    request = good()
    request._tensors[1]._array = np.array([[1.0], [np.nan]], np.float32)
    assert read_one(RequestReader(SPEC), request).rows == 2  # allowed unless the config says reject_nan
    with pytest.raises(RequestError, match=r"input 'scale': NaN or infinity at index \[1, 0\]"):
        read_one(RequestReader(replace(SPEC, serving=replace(SPEC.serving, reject_nan=True))), request)


def test_one_call_reads_every_request_and_a_bad_one_fails_alone():
    requests = [good(rows=1, length=3), Request(tokens=np.ones((1, 5), np.int32), scale=np.ones((1, 1), np.float32)),
                good(rows=2, length=7), Request(parameters="{not json", tokens=np.ones((1, 2), np.int64),
                                                scale=np.ones((1, 1), np.float32))]
    first, wrong_type, second, bad_json = RequestReader(SPEC).read_all(requests)
    assert (first.rows, first.length) == (1, 3)
    assert (second.rows, second.length) == (2, 7)
    assert isinstance(wrong_type, RequestError) and "expected data type INT64, got INT32" in str(wrong_type)
    assert isinstance(bad_json, RequestError) and "not valid JSON" in str(bad_json)


def test_requests_without_parameters_share_no_state():
    first, second = RequestReader(SPEC).read_all([good(), good()])
    assert first.parameters == {} and second.parameters == {}
    with pytest.raises(TypeError):
        first.parameters["priority_level"] = 3  # the shared empty mapping is read-only


def test_integer_values_outside_the_declared_range_are_refused_with_the_range():
    from dataclasses import replace

    tokens, scale = SPEC.signature.inputs
    ranged = replace(SPEC, signature=replace(SPEC.signature, inputs=(replace(tokens, valid_range=(0, 999)), scale)))
    request = good(rows=2, length=4)
    request._tensors[0]._array = np.array([[1, 2, 3, 4], [5, 1000, 7, 8]], np.int64)
    with pytest.raises(RequestError, match=r"input 'tokens': value 1000 at index \[1, 1\] is outside this model's "
                                           r"valid range 0\.\.999"):
        read_one(RequestReader(ranged), request)
    assert read_one(RequestReader(SPEC), request).rows == 2  # no range declared: any id passes


def test_a_call_of_readable_requests_without_parameters_runs_with_the_defaults():
    call = RequestReader(SPEC).read_call([good(rows=1), good(rows=2)])
    assert call.options is None and call.count == 2
    assert [item.rows for item in call.items] == [1, 2]


@pytest.mark.parametrize("odd", [
    Request(parameters='{"priority_level": 1}', tokens=np.ones((1, 3), np.int64), scale=np.ones((1, 1), np.float32)),
    Request(tokens=np.ones((1, 3), np.int32), scale=np.ones((1, 1), np.float32)),
    Request(tokens=np.ones((1, 3), np.int64)),
], ids=["parameters", "refused", "missing-input"])
def test_one_request_with_parameters_or_refused_is_read_for_what_it_is(odd):
    call = RequestReader(SPEC).read_call([good(), odd])
    assert call.items[0].rows == 2  # the good one is read all the same
    if odd.parameters():  # every request gets its options, the defaults where it sent none
        assert [o.priority for o in call.options] == [0, 1]
    else:  # refused, and no request with options
        assert isinstance(call.items[1], RequestError) and call.options is None


def test_a_timeout_makes_the_call_not_plain():
    class Timed(Request):
        def timeout(self):
            return 5000

    timed = Timed(tokens=np.ones((1, 3), np.int64), scale=np.ones((1, 1), np.float32))
    call = RequestReader(SPEC).read_call([good(), timed])
    assert call.items[1].timeout_us == 5000 and call.options[1].timeout_ms == 5.0


ONE_SHAPE = ModelSpec(
    ModelSignature(name="pair", inputs=(TensorSpec("a", np.dtype(np.float32), (3,)),
                                        TensorSpec("b", np.dtype(np.int64), (2,))),
                   outputs=(TensorSpec("y", np.dtype(np.float32), (1,)),), max_batch_size=8,
                   runtime="onnx", model_path=None),
    ServingOptions(),
)


def pair(rows=1, **changes):
    arrays = {"b": np.ones((rows, 2), np.int64), "a": np.ones((rows, 3), np.float32)}  # in any order
    arrays.update(changes)
    return Request(**{k: v for k, v in arrays.items() if v is not None})


def test_a_plain_call_is_read_by_input_in_the_order_of_its_requests():
    first, second = pair(rows=2, a=np.zeros((2, 3), np.float32)), pair(rows=1)
    call = RequestReader(ONE_SHAPE, by_columns=True).read_call([first, second])
    assert call.items is None and call.count == 2
    assert list(call.arrays) == ["a", "b"]
    assert [x.shape for x in call.arrays["a"]] == [(2, 3), (1, 3)]
    assert call.arrays["a"][0] is first.inputs()[1].as_numpy()
    assert call.rows == [2, 1]


@pytest.mark.parametrize("odd", [
    pair(a=np.ones((1, 3), np.float64)),           # a check fails
    pair(b=None),                                  # an input missing
    pair(rows=2, b=np.ones((1, 2), np.int64)),     # inputs disagree on rows
    Request(parameters='{"priority_level": 1}', a=np.ones((1, 3), np.float32), b=np.ones((1, 2), np.int64)),
], ids=["refused", "missing-input", "rows-disagree", "parameters"])
def test_anything_but_a_plain_call_is_read_request_by_request(odd):
    call = RequestReader(ONE_SHAPE, by_columns=True).read_call([pair(), odd])  # each request for what it is
    assert call.arrays is None and call.items[0].rows == 1
    if odd.parameters():
        assert call.items[1].parameters == {"priority_level": 1}
    else:
        assert isinstance(call.items[1], RequestError)


def test_a_one_input_call_with_a_stray_input_is_read_request_by_request():
    spec = ModelSpec(ModelSignature(name="one", inputs=(TensorSpec("a", np.dtype(np.float32), (3,)),),
                                    outputs=(TensorSpec("y", np.dtype(np.float32), (1,)),), max_batch_size=8,
                                    runtime="onnx", model_path=None), ServingOptions())
    reader = RequestReader(spec, by_columns=True)
    assert reader.read_call([Request(a=np.ones((1, 3), np.float32))]).rows == [1]
    stray = reader.read_call([Request(x=np.ones((1, 3), np.float32))])
    assert stray.arrays is None and str(stray.items[0]).startswith("unexpected input 'x'")
    both = reader.read_call([Request(a=np.ones((1, 3), np.float32), x=np.ones((1, 3), np.float32))])
    assert both.arrays is None and isinstance(both.items[0], RequestError)
    none = reader.read_call([Request()])
    assert none.arrays is None and str(none.items[0]).startswith("missing input(s) ['a']")


def test_a_plain_ragged_call_is_read_with_each_requests_longest_length():
    spec = ModelSpec(ModelSignature(name="pairs", inputs=(TensorSpec("ids", np.dtype(np.int64), (-1,), ragged=True),
                                                          TensorSpec("mask", np.dtype(np.int64), (-1,), ragged=True)),
                                    outputs=(TensorSpec("y", np.dtype(np.float32), (1,)),), max_batch_size=8,
                                    runtime="onnx", model_path=None), ServingOptions())
    reader = RequestReader(spec, by_columns=True)
    columns = reader.read_call([Request(ids=np.ones((1, 5), np.int64), mask=np.ones((1, 7), np.int64)),
                                   Request(ids=np.ones((2, 9), np.int64), mask=np.ones((2, 3), np.int64))])
    assert columns.rows == [1, 2] and columns.lengths == [7, 9]
    assert RequestReader(ONE_SHAPE, by_columns=True).read_call([pair()]).lengths is None  # nothing ragged


class FaultyTensor(Tensor):
    def as_numpy(self):
        raise RuntimeError("shared memory region is gone")


@pytest.mark.parametrize("by_columns", [False, True])
def test_a_tensor_the_stub_cannot_give_fails_that_request_alone_as_an_internal_error(by_columns):
    from latte.backend.errors import ModelError

    faulty = good()
    faulty._tensors[1] = FaultyTensor("scale", None)
    call = RequestReader(SPEC, by_columns=by_columns).read_call([good(), faulty, good()])
    first, failed, last = call.items
    assert first.rows == 2 and last.rows == 2
    assert type(failed) is ModelError and failed.code == "INTERNAL"
    assert str(failed) == "model 'seq' could not read the request: RuntimeError: shared memory region is gone"
    assert "Traceback" in failed.detail and "as_numpy" in failed.detail  # for the server log, not the client
