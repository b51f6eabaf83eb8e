"""Reliability against a real tritonserver: a model that raises, clients that vanish mid-request,
a restart on the same repository, and a Python backend stub killed under the server."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from latte.bench.procmem import stub_pids
from latte.generator.model_folder import write_model
from latte.triton import TritonServer

from conftest import assert_stopped_promptly

GUARDED = "guarded_torchscript"


def _build_guarded_model(path):
    """A TorchScript model that doubles its input and raises on any negative value."""
    import torch

    class Guarded(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if bool((x < 0).any()):
                raise RuntimeError("negative input is not allowed")
            return x * 2.0

    torch.jit.script(Guarded()).save(str(path))


@pytest.fixture(scope="module")
def guarded_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("reliability")
    model_file = root / "model.pt"
    _build_guarded_model(model_file)
    context = {
        "name": GUARDED, "backend": "latte", "max_batch_size": 16,
        "inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
        # A long queue delay gathers a whole burst into one execute call.
        "dynamic_batching": {"max_queue_delay_microseconds": 50000},
        "instance_groups": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {"model_file": "model.pt", "runtime": "torchscript", "intra_op_threads": "1",
                       "inter_op_threads": "1"},
    }
    write_model(root / "repo", context, {"model.pt": model_file})
    return root / "repo"


@pytest.fixture(scope="module")
def guarded_server(guarded_repo, tmp_path_factory):
    with TritonServer(guarded_repo, log_path=tmp_path_factory.mktemp("guarded") / "log") as server:
        yield server
    assert_stopped_promptly(server)


def _grpc_input(array):
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput("x", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return [tensor]


def _infer_guarded(url, array, timeout_s=30.0):
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(url) as client:
        return client.infer(GUARDED, _grpc_input(array), client_timeout=timeout_s).as_numpy("y")


def test_a_model_error_fails_only_its_own_request_in_a_burst(guarded_server):
    import tritonclient.grpc as grpcclient

    feeds = [np.full((1, 4), float(i + 1), np.float32) for i in range(8)]
    feeds[3] = np.full((1, 4), -1.0, np.float32)
    answers = {}
    done = threading.Event()
    lock = threading.Lock()

    def callback(index):
        def record(result, error):
            with lock:
                answers[index] = error if error is not None else result.as_numpy("y")
                if len(answers) == len(feeds):
                    done.set()
        return record

    client = grpcclient.InferenceServerClient(guarded_server.grpc_url)
    try:
        for i, feed in enumerate(feeds):
            client.async_infer(GUARDED, _grpc_input(feed), callback=callback(i))
        assert done.wait(60), f"only {len(answers)} of {len(feeds)} answers arrived"
    finally:
        client.close()
    assert isinstance(answers[3], InferenceServerException)
    assert "negative input is not allowed" in str(answers[3])
    for i, feed in enumerate(feeds):
        if i != 3:
            np.testing.assert_allclose(answers[i], feed * 2.0)
    # The burst really ran together: Triton saw fewer executions than requests.
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{guarded_server.http_url}/v2/models/{GUARDED}/stats") as r:
        stats = json.loads(r.read())["model_stats"][0]
    assert int(stats["execution_count"]) < int(stats["inference_count"])


def _infer_body(model_input: str, shape, values) -> bytes:
    import json

    return json.dumps({"inputs": [{"name": model_input, "shape": list(shape), "datatype": "FP32",
                                   "data": values}]}).encode()


@pytest.mark.parametrize("cut", ["after-headers", "mid-body", "before-response"])
def test_a_client_that_disconnects_mid_request_leaves_the_server_serving(server, clients, cut, rng):
    host, port = server.http_url.split(":")
    body = _infer_body("features", (2, 16), [0.5] * 32)
    head = (f"POST /v2/models/mlp_onnx/infer HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sent = {"after-headers": head, "mid-body": head + body[: len(body) // 2], "before-response": head + body}[cut]
    for _ in range(5):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(sent)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    assert server.is_alive()
    for protocol in ("http", "grpc"):
        result = clients.infer(protocol, "mlp_onnx", {"features": rng.standard_normal((3, 16)).astype(np.float32)})
        assert result.as_numpy("logits").shape == (3, 8)


@pytest.fixture(scope="module")
def abandoned_server(example_repo, tmp_path_factory):
    """The example repository on a server of its own: requests its clients abandon cannot hold
    up the stop of the server the other tests share."""
    with TritonServer(example_repo, log_path=tmp_path_factory.mktemp("abandoned") / "log") as server:
        yield server
    assert_stopped_promptly(server)


def test_a_grpc_client_closed_with_requests_in_flight_leaves_the_server_serving(abandoned_server, rng):
    import tritonclient.grpc as grpcclient

    from latte.bench.loadgen import grpc_inputs

    for _ in range(3):
        client = grpcclient.InferenceServerClient(abandoned_server.grpc_url)
        for _ in range(8):
            feed = {"tokens": rng.integers(1, 1000, size=(1, 128), dtype=np.int64)}
            client.async_infer("sequence_onnx", grpc_inputs(feed), callback=lambda *_, **__: None)
        client.close()
    assert abandoned_server.is_alive()
    with grpcclient.InferenceServerClient(abandoned_server.grpc_url) as client:
        feed = {"tokens": rng.integers(1, 1000, size=(2, 9), dtype=np.int64)}
        assert client.infer("sequence_onnx", grpc_inputs(feed)).as_numpy("embedding").shape == (2, 32)


def test_tritonserver_restarted_on_the_same_repository_and_ports_serves_again(guarded_repo, tmp_path):
    first = TritonServer(guarded_repo, log_path=tmp_path / "first.log")
    with first:
        np.testing.assert_allclose(_infer_guarded(first.grpc_url, np.ones((1, 4), np.float32)), 2.0)
        stubs = stub_pids(first.process.pid)
        assert stubs, "the latte model runs in a Python backend stub process"
    assert first.stop() is not None and not first.is_alive()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in stubs), "stub processes outlived the server"
    again = TritonServer(guarded_repo, http_port=first.http_port, grpc_port=first.grpc_port,
                         metrics_port=first.metrics_port, log_path=tmp_path / "second.log")
    with again:
        np.testing.assert_allclose(_infer_guarded(again.grpc_url, np.full((1, 4), 3.0, np.float32)), 6.0)


def test_a_killed_stub_process_fails_its_model_clearly_and_never_hangs(guarded_repo, tmp_path):
    """Triton 2.51's Python backend does not restart a killed stub: each request to that instance
    fails within about a second with an error naming the stub; the server itself stays up."""
    server = TritonServer(guarded_repo, log_path=tmp_path / "log").start()
    try:
        _check_killed_stub(server)
    finally:
        # With its stub gone, Triton's own shutdown waits for it; the test does not need to.
        server.stop(grace=3)


def _check_killed_stub(guarded_server):
    np.testing.assert_allclose(_infer_guarded(guarded_server.grpc_url, np.ones((1, 4), np.float32)), 2.0)
    victims = stub_pids(guarded_server.process.pid)
    assert victims
    os.kill(victims[0], signal.SIGKILL)
    outcomes = []
    for _ in range(4):
        started = time.monotonic()
        try:
            np.testing.assert_allclose(
                _infer_guarded(guarded_server.grpc_url, np.full((1, 4), 5.0, np.float32), timeout_s=20), 10.0)
            outcomes.append(("answered", time.monotonic() - started))
        except InferenceServerException as exc:
            outcomes.append((str(exc), time.monotonic() - started))
    assert all(elapsed < 20 for _, elapsed in outcomes), f"a request waited for the dead stub: {outcomes}"
    assert outcomes[0][0] == f"[StatusCode.INTERNAL] Stub process '{GUARDED}_0_0' is not healthy.", outcomes
    assert guarded_server.is_alive()
    # The rest of the server still answers: its health endpoint and metadata respond.
    import urllib.request

    with urllib.request.urlopen(f"http://{guarded_server.http_url}/v2/health/live", timeout=5) as r:
        assert r.status == 200
