"""Each failure reaches the client with the Triton status code that says whose fault it was."""

import pytest

from latte.backend.config import ConfigError
from latte.backend.engine import DeadlineExceeded, ModelError
from latte.backend.lanes import Overloaded
from latte.backend.requests import RequestCancelled, RequestError
from latte.backend.responses import ResponseBuilder


class FakeTritonError:
    INVALID_ARG, INTERNAL, UNAVAILABLE, CANCELLED, DEADLINE_EXCEEDED = "invalid", "internal", "unavailable", "cancelled", "deadline"

    def __init__(self, message, code=None):
        self.message, self.code = message, code


class FakePb:
    TritonError = FakeTritonError


@pytest.mark.parametrize("exc, code", [
    (RequestError("input 'x': expected data type FP32, got FP64"), "invalid"),
    (ConfigError("bad config"), "invalid"),
    (MemoryError("arena full"), "unavailable"),
    (Overloaded("overloaded: the request was not admitted (queue_full)"), "unavailable"),
    (RequestCancelled("the client cancelled this request before it ran"), "cancelled"),
    (DeadlineExceeded("timed out"), "deadline"),
    (ModelError("model 'm' failed: ValueError: negative input"), "internal"),
])
def test_each_failure_carries_its_code_and_its_one_line(exc, code):
    error = ResponseBuilder(FakePb(), ["y"]).triton_error(exc)
    assert error.code == code
    assert error.message == str(exc)
