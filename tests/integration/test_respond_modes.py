"""Every way of answering gives every request exactly one correct response, bad ones
included: `respond: auto` (earlier batches through response senders where that pays),
`per_batch` (earlier batches through response senders, the last in execute's return value),
`per_call` (all in the return value) and `async_execute: true` (execute
returns at once; the scheduler's lanes answer through response senders)."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from latte.examples import EXAMPLES, model_context, reference_runner
from latte.generator.model_folder import write_model
from latte.triton import TritonServer

from conftest import Clients, assert_stopped_promptly

MODES = {"auto": {"respond": "auto"}, "per_batch": {"respond": "per_batch"}, "per_call": {"respond": "per_call"},
         "async_execute": {"async_execute": "true", "batch_window_us": "5000"}}


@pytest.fixture(scope="module")
def respond_server(example_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("respond") / "repo"
    source = example_repo / "sequence_onnx" / "1" / "model.onnx"
    for mode, parameters in MODES.items():
        context = model_context(EXAMPLES["sequence"], "onnx", "model.onnx")
        context["name"] = f"sequence_{mode}"
        # A long batch window, so one execute call holds requests of several buckets.
        context["dynamic_batching"] = {"max_queue_delay_microseconds": 50000}
        # One batch per shape bucket, so a call runs several batches.
        context["parameters"] = {**context["parameters"], **parameters, "warmup": "false", "batch_planning": "bucket"}
        write_model(repo, context, {"model.onnx": source})
    with TritonServer(repo, log_path=repo.parent / "tritonserver.log") as server:
        yield server
    assert_stopped_promptly(server)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_request_gets_one_answer_in_either_mode(respond_server, example_repo, mode, protocol):
    reference = reference_runner(example_repo, "sequence_onnx")
    rng = np.random.default_rng(11)
    feeds = [{"tokens": rng.integers(1, 1000, size=(1, n), dtype=np.int64)} for n in (3, 40, 9, 120, 17, 70)]
    bad = {"tokens": rng.integers(1, 1000, size=(1, 500), dtype=np.int64)}   # past max_sequence_length

    def send(feed):
        clients = Clients(respond_server)  # one client per thread: the HTTP client is not thread-safe
        try:
            return clients.infer(protocol, f"sequence_{mode}", feed).as_numpy("embedding")
        except Exception as exc:  # tritonclient raises InferenceServerException for error responses
            return exc
        finally:
            clients.close()

    with ThreadPoolExecutor(len(feeds) + 1) as pool:
        answers = list(pool.map(send, feeds + [bad]))
    for feed, answer in zip(feeds, answers):
        np.testing.assert_allclose(answer, reference(feed)["embedding"], rtol=1e-5, atol=1e-6)
    assert isinstance(answers[-1], Exception) and "exceeds this model's maximum of 128" in str(answers[-1])
    # The next good request still succeeds.
    np.testing.assert_allclose(send(feeds[0]), reference(feeds[0])["embedding"], rtol=1e-5, atol=1e-6)
