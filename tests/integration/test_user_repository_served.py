"""A repository written the way Triton users write theirs (each Python model with its own
`utils.py`, a file read from args["model_repository"], one row per request), its ensemble and
its `latte fuse` copy served side by side by one real tritonserver: the fused model loads and
answers every text as the ensemble does, bit for bit, over HTTP and gRPC."""

import numpy as np
import pytest

from conftest import assert_stopped_promptly

pytestmark = pytest.mark.integration

TEXTS = [b"the quick brown fox", b"latte serves", b"words outside the vocabulary file", b"",
         b"one more text to embed " * 20]


@pytest.fixture(scope="module")
def user_written(tmp_path_factory):
    from fused_copies import fused_beside_ensemble
    from latte.examples.user_repository import write_user_repository
    from latte.triton import TritonServer

    work = tmp_path_factory.mktemp("user-written")
    served = fused_beside_ensemble(work, write_user_repository(work / "repo"), "embed_text")
    with TritonServer(served, log_path=work / "tritonserver.log") as server:
        yield server
    assert_stopped_promptly(server)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_fused_user_repository_answers_as_its_ensemble_bit_for_bit(user_written, protocol, same_output):
    if protocol == "http":
        import tritonclient.http as module

        client = module.InferenceServerClient(user_written.http_url)
    else:
        import tritonclient.grpc as module

        client = module.InferenceServerClient(user_written.grpc_url)
    for text in TEXTS:
        answers = []
        for model in ("embed_text_fused", "embed_text"):
            request = module.InferInput("TEXT", [1, 1], "BYTES")
            request.set_data_from_numpy(np.array([[text]], dtype=object))
            answers.append(client.infer(model, [request]))
        fused, ensemble = answers
        same_output(fused.as_numpy("EMBEDDING"), ensemble.as_numpy("EMBEDDING"), (1, 32), np.float32, (text, "EMBEDDING"))
        same_output(fused.as_numpy("NORM"), ensemble.as_numpy("NORM"), (1, 1), np.float32, (text, "NORM"))
    client.close()
