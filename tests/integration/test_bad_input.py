"""Bad requests get one clear error each; the server stays up and the next good request works."""

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from latte.examples import EXAMPLES

BAD_REQUESTS = [
    ("mlp_onnx", {"features": np.ones((1, 16), np.float64)}, "FP64.*expects 'FP32'|expected data type FP32"),
    ("mlp_torchscript", {"features": np.ones((1, 15), np.float32)}, r"unexpected shape|expected shape"),
    ("cnn_onnx", {}, r"expected 1 inputs but got 0|missing input"),
    ("mlp_onnx", {"features": np.ones((65, 16), np.float32)}, r"batch-size must be <= 64|1 to 64 rows"),
    ("sequence_torchscript", {"tokens": np.ones((1, 200), np.int64)}, "length 200 exceeds this model's maximum of 128"),
    ("mlp_onnx", {"features": np.ones((1, 16), np.float32), "extra": np.ones((1, 1), np.float32)},
     r"Got input\(s\) \['extra','features'\]|unexpected input 'extra'"),
]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model, feed, message", BAD_REQUESTS,
                         ids=["dtype", "shape", "missing", "oversized-batch", "over-long", "extra-input"])
def test_bad_request_gets_a_clear_error_and_the_next_good_one_succeeds(server, clients, model, feed, message,
                                                                       protocol, rng):
    with pytest.raises(InferenceServerException, match=message):
        clients.infer(protocol, model, feed)
    assert server.is_alive()
    example = EXAMPLES[model.rsplit("_", 1)[0]]
    result = clients.infer(protocol, model, example.sample(2, rng))
    assert result.as_numpy(example.outputs[0].name).shape[0] == 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["sequence_onnx", "sequence_torchscript"])
@pytest.mark.parametrize("token", [1000, -3], ids=["past-the-vocabulary", "negative"])
def test_token_ids_outside_the_declared_range_are_refused_alike_by_every_runtime(server, clients, model, protocol,
                                                                                 token, rng):
    tokens = np.array([[5, 7, token, 9]], np.int64)
    with pytest.raises(InferenceServerException) as raised:
        clients.infer(protocol, model, {"tokens": tokens})
    # latte's own reader refuses it (Triton's core knows no value ranges): one line, no traceback.
    message = str(raised.value)
    assert f"input 'tokens': value {token} at index [0, 2] is outside this model's valid range 0..999" in message
    assert "Traceback" not in message and "\n" not in message.strip()
    if protocol == "grpc":
        assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    else:
        assert raised.value.status() == "400"
    good = clients.infer(protocol, model, EXAMPLES["sequence"].sample(1, rng))
    assert good.as_numpy("embedding").shape == (1, 32)
