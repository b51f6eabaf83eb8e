"""Latte's errors reach HTTP and gRPC clients with the status code latte.backend.errors gives
them (docs/backend.md, "Errors"). Each request here is one only latte refuses, and each
test checks latte's own words, so a refusal by Triton's core could not pass for latte's."""

import re

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from latte.examples import EXAMPLES

# How tritonclient reports a Triton status code: HTTP's status number, gRPC's status name.
INVALID_ARG = [("http", "400"), ("grpc", "StatusCode.INVALID_ARGUMENT")]
UNAVAILABLE = [("http", "503"), ("grpc", "StatusCode.UNAVAILABLE")]

# Latte's timeouts: the engine's (inline) or the scheduler's (lanes); Triton's own reads
# "Request timeout expired".
# Inline, the engine refuses the request before its batch runs; on lanes, the scheduler does.
LATTE_TIMEOUT = (r"timed out: (waited [\d.]+ ms, longer than timeout_ms=0\.0001"
                 r"|timeout_ms=0\.0001 ran out before a lane could run the request \(it waited [\d.]+ ms\))")


def _refusal(clients, protocol, model, feed, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as raised:
        clients.infer(protocol, model, feed, **kwargs)
    return raised.value


@pytest.mark.parametrize("protocol, status", INVALID_ARG, ids=["http", "grpc"])
def test_a_value_latte_s_reader_refuses_is_invalid_arg(clients, protocol, status):
    error = _refusal(clients, protocol, "sequence_onnx", {"tokens": np.array([[5, 1000]], np.int64)})
    assert "input 'tokens': value 1000 at index [0, 1] is outside this model's valid range 0..999" in str(error)
    assert error.status() == status


@pytest.mark.parametrize("protocol, status", INVALID_ARG, ids=["http", "grpc"])
def test_a_request_parameter_latte_refuses_is_invalid_arg(clients, protocol, status, rng):
    error = _refusal(clients, protocol, "mlp_onnx", EXAMPLES["mlp"].sample(1, rng),
                     parameters={"session_id": "chat-1", "session_start": "maybe"})
    assert "parameter 'session_start' must be a boolean, got 'maybe'" in str(error)
    assert error.status() == status


@pytest.mark.parametrize("protocol, status", UNAVAILABLE, ids=["http", "grpc"])
@pytest.mark.parametrize("lanes", [False, True], ids=["inline", "lanes"])
def test_a_request_past_its_deadline_is_unavailable_like_triton_s_own_timeouts(clients, patient_model, protocol,
                                                                               status, lanes, rng):
    """Triton has no DEADLINE_EXCEEDED code; a timed-out request is told to come back later."""
    model = patient_model if lanes else "sequence_torchscript"  # the patient model runs on two lanes
    feed = EXAMPLES["sequence"].sample(1, rng)
    error = _refusal(clients, protocol, model, feed, parameters={"timeout_ms": 0.0001})
    assert error.status() == status
    assert re.search(LATTE_TIMEOUT, str(error)), str(error)
    answered = clients.infer(protocol, model, feed, parameters={"timeout_ms": 10000})
    assert answered.as_numpy("embedding").shape == (1, 32)
