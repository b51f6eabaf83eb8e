"""Bad requests get one clear error each; the server stays up and the next good request works.

Triton's core checks a request against the model config before the backend sees it, so a
wrong data type, shape, batch size or set of inputs is refused by Triton, in Triton's words.
What the config cannot say (value ranges, the longest sequence, request parameters) only
latte's reader checks; those tests assert latte's own wording, which Triton never writes.
"""

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from latte.backend.options import MAX_PRIORITY
from latte.examples import EXAMPLES

# What Triton 2.51's core answers before latte runs: the generated config declares each rule.
REFUSED_BY_TRITON = [
    ("mlp_onnx", {"features": np.ones((1, 16), np.float64)}, r"FP64.*expects 'FP32'"),
    ("mlp_torchscript", {"features": np.ones((1, 15), np.float32)}, r"unexpected shape for input 'features'"),
    ("cnn_onnx", {}, r"expected 1 inputs but got 0 inputs"),
    ("mlp_onnx", {"features": np.ones((65, 16), np.float32)}, r"batch-size must be <= 64"),
    ("mlp_onnx", {"features": np.ones((1, 16), np.float32), "extra": np.ones((1, 1), np.float32)},
     r"Got input\(s\) \['extra','features'\]"),
]

# What only latte's reader and its parameter parser refuse: their own wording, whole.
REFUSED_BY_LATTE = [
    ("sequence_torchscript", {"tokens": np.ones((1, 200), np.int64)}, None,
     "input 'tokens': length 200 exceeds this model's maximum of 128"),
    ("sequence_onnx", {"tokens": np.ones((1, 200), np.int64)}, None,
     "input 'tokens': length 200 exceeds this model's maximum of 128"),
    ("mlp_onnx", {"features": np.ones((1, 16), np.float32)}, {"priority_level": MAX_PRIORITY + 1},
     f"parameter 'priority_level' must be an integer from 0 to {MAX_PRIORITY}, got {MAX_PRIORITY + 1}"),
    ("mlp_onnx", {"features": np.ones((1, 16), np.float32)}, {"timeout_ms": -5},
     "parameter 'timeout_ms' must be > 0, got -5.0"),
    ("mlp_onnx", {"features": np.ones((1, 16), np.float32)}, {"session_id": "chat-1"},
     "model 'mlp_onnx' keeps no session state; drop session_id"),
]


def _next_good_request_succeeds(clients, protocol, model, rng):
    example = EXAMPLES[model.rsplit("_", 1)[0]]
    result = clients.infer(protocol, model, example.sample(2, rng))
    assert result.as_numpy(example.outputs[0].name).shape[0] == 2


# INVALID_ARG as tritonclient reports it: HTTP's status number, gRPC's status name.
INVALID_ARG = [("http", "400"), ("grpc", "StatusCode.INVALID_ARGUMENT")]


@pytest.mark.parametrize("protocol, status", INVALID_ARG, ids=["http", "grpc"])
@pytest.mark.parametrize("model, feed, message", REFUSED_BY_TRITON,
                         ids=["dtype", "shape", "missing", "oversized-batch", "extra-input"])
def test_a_request_the_config_rules_out_is_refused_by_triton_and_the_next_good_one_succeeds(
        server, clients, model, feed, message, protocol, status, rng):
    with pytest.raises(InferenceServerException, match=message) as raised:
        clients.infer(protocol, model, feed)
    assert raised.value.status() == status
    assert server.is_alive()
    _next_good_request_succeeds(clients, protocol, model, rng)


@pytest.mark.parametrize("protocol, status", INVALID_ARG, ids=["http", "grpc"])
@pytest.mark.parametrize("model, feed, parameters, message", REFUSED_BY_LATTE,
                         ids=["over-long-torchscript", "over-long-onnx", "priority-level", "timeout-ms",
                              "session-without-state"])
def test_a_request_only_latte_can_judge_is_refused_in_latte_s_words(server, clients, model, feed, parameters,
                                                                    message, protocol, status, rng):
    with pytest.raises(InferenceServerException) as raised:
        clients.infer(protocol, model, feed, **({"parameters": parameters} if parameters else {}))
    text = str(raised.value)
    assert message in text
    assert "Traceback" not in text and "\n" not in text.strip()
    assert raised.value.status() == status
    assert server.is_alive()
    _next_good_request_succeeds(clients, protocol, model, rng)


@pytest.mark.parametrize("protocol, status", INVALID_ARG, ids=["http", "grpc"])
@pytest.mark.parametrize("model", ["sequence_onnx", "sequence_torchscript"])
@pytest.mark.parametrize("token", [1000, -3], ids=["past-the-vocabulary", "negative"])
def test_token_ids_outside_the_declared_range_are_refused_alike_by_every_runtime(server, clients, model, protocol,
                                                                                 status, token, rng):
    tokens = np.array([[5, 7, token, 9]], np.int64)
    with pytest.raises(InferenceServerException) as raised:
        clients.infer(protocol, model, {"tokens": tokens})
    # latte's own reader refuses it (Triton's core knows no value ranges): one line, no traceback.
    message = str(raised.value)
    assert f"input 'tokens': value {token} at index [0, 2] is outside this model's valid range 0..999" in message
    assert "Traceback" not in message and "\n" not in message.strip()
    assert raised.value.status() == status
    good = clients.infer(protocol, model, EXAMPLES["sequence"].sample(1, rng))
    assert good.as_numpy("embedding").shape == (1, 32)
