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
