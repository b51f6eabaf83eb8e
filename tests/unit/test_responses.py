"""Each failure reaches the client with the Triton status code that says whose fault it was."""

import pytest

from latte.backend.errors import (ConfigError, DeadlineExceeded, ModelError, Overloaded, RequestCancelled,
                                  RequestError)
from latte.backend.engine import BatchAnswer
from latte.backend.responses import ResponseBuilder


class FakeTritonError:
    """The codes of Triton 2.51's pb_utils.TritonError (it has no DEADLINE_EXCEEDED)."""
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message, code=None):
        self.message, self.code = message, code


class FakePb:
    TritonError = FakeTritonError


@pytest.mark.parametrize("exc, code", [
    (RequestError("input 'x': expected data type FP32, got FP64"), FakeTritonError.INVALID_ARG),
    (ConfigError("bad config"), FakeTritonError.INVALID_ARG),
    (MemoryError("arena full"), FakeTritonError.UNAVAILABLE),
    (Overloaded("overloaded: the request was not admitted (queue_full)"), FakeTritonError.UNAVAILABLE),
    (RequestCancelled("the client cancelled this request before it ran"), FakeTritonError.CANCELLED),
    (DeadlineExceeded("timed out"), FakeTritonError.UNAVAILABLE),
    (ModelError("model 'm' failed: ValueError: negative input"), FakeTritonError.INTERNAL),
    (KeyError("a fault nobody foresaw"), FakeTritonError.INTERNAL),
], ids=["request", "config", "memory", "overloaded", "cancelled", "deadline", "model", "unforeseen"])
def test_each_failure_carries_its_code_and_its_one_line(exc, code):
    error = ResponseBuilder(FakePb(), ["y"]).triton_error(exc)
    assert error.code == code
    assert error.message == str(exc)


def test_a_stub_without_the_code_still_answers_with_its_default_code():
    class OldTritonError:
        """A stub's TritonError from before CANCELLED existed."""
        UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS = range(7)

        def __init__(self, message, code=None):
            self.message, self.code = message, code

    class OldPb:
        TritonError = OldTritonError

    error = ResponseBuilder(OldPb(), ["y"]).triton_error(RequestCancelled("the client cancelled"))
    assert error.code is None and error.message == "the client cancelled"


def test_a_call_of_outputs_becomes_one_response_each_and_an_output_triton_cannot_carry_fails_alone():
    import numpy as np

    class Tensor:
        def __init__(self, name, array):
            if array.dtype == np.complex64:
                raise TypeError("unsupported dtype complex64")
            self.name, self.array = name, array

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self.output_tensors, self.error = output_tensors, error

    class Pb:
        TritonError = FakeTritonError

    Pb.Tensor, Pb.InferenceResponse = Tensor, InferenceResponse
    builder = ResponseBuilder(Pb, ["y", "z"])
    fine = {"y": np.zeros(2, np.float32), "z": np.ones(1, np.int64)}
    odd = {"y": np.zeros(2, np.complex64), "z": np.ones(1, np.int64)}
    first, second = builder.answer(BatchAnswer([0, 1], [fine, fine]))
    assert [t.name for t in first.output_tensors] == ["y", "z"] and second.error is None
    ok, failed = builder.answer(BatchAnswer([0, 1], [fine, odd]))
    assert ok.error is None and [t.name for t in ok.output_tensors] == ["y", "z"]
    assert failed.output_tensors == [] and "could not build the response" in failed.error.message


def test_a_streams_response_carries_the_outputs_its_outcome_holds_and_the_others_each_declared_one():
    import numpy as np

    class Pb:
        TritonError = FakeTritonError

        class Tensor:
            def __init__(self, name, array):
                self.name = name

        class InferenceResponse:
            def __init__(self, output_tensors, error=None):
                self.output_tensors, self.error = output_tensors, error

    closing = {"text_output": np.array([b""], dtype=object), "finish_reason": np.array([b"stop"], dtype=object)}
    streamed = ResponseBuilder(Pb, ["text_output", "finish_reason", "num_output_tokens"], as_given=True)
    assert [t.name for t in streamed.build(closing).output_tensors] == ["text_output", "finish_reason"]
    every = ResponseBuilder(Pb, ["text_output", "finish_reason", "num_output_tokens"])
    failed = every.build(closing)  # a declared output missing: the request gets an error, not a short response
    assert failed.output_tensors == [] and "could not build the response" in failed.error.message
