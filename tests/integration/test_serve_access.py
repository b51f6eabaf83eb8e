"""`latte serve` off loopback: Triton's administrative APIs (shared memory, model repository,
logging, trace) answer only callers with the access token's header, over HTTP and gRPC, while
inference needs no header."""

import re
import subprocess
import sys
import time
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration

LATTE = Path(sys.executable).parent / "latte"
TOKEN = "an-admin-key-for-this-test"


@pytest.fixture(scope="module")
def served(example_repo, tmp_path_factory):
    from latte.triton.server import free_port

    ports = {name: free_port() for name in ("http", "grpc", "metrics")}
    log = tmp_path_factory.mktemp("serve-access") / "serve.log"
    with open(log, "w") as out:
        process = subprocess.Popen([str(LATTE), "serve", str(example_repo), "--address", "0.0.0.0",
                                    "--access-token", TOKEN, "--http-port", str(ports["http"]),
                                    "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"])],
                                   stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while time.time() < deadline and "ready" not in log.read_text():
        assert process.poll() is None, log.read_text()
        time.sleep(0.5)
    yield ports, log.read_text()
    process.terminate()
    process.wait(60)
    assert "tritonserver stopped (exit code 0)" in log.read_text()
    assert "it waited" not in log.read_text()  # no client left a connection open


def test_serve_says_which_apis_need_which_header(served):
    _, printed = served
    assert (f"listening on 0.0.0.0: shared-memory, model-repository, logging, trace need the header "
            f"latte-admin-key: {TOKEN} (over gRPC: triton-grpc-protocol-latte-admin-key); inference does not"
            in printed)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_log_settings_and_shared_memory_need_the_header_and_inference_does_not(served, protocol):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    ports, _ = served
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(f"127.0.0.1:{ports[protocol]}")
    header = {"latte-admin-key": TOKEN} if protocol == "http" else {"triton-grpc-protocol-latte-admin-key": TOKEN}
    refused = ("403", "This API is restricted, expecting header 'latte-admin-key'") if protocol == "http" else \
        ("StatusCode.UNAVAILABLE", "This protocol is restricted, expecting header "
                                   "'triton-grpc-protocol-latte-admin-key'")
    region = shared_memory.SharedMemory(name=f"latte_access_{protocol}", create=True, size=64)
    try:
        for call in (lambda **kw: client.update_log_settings({"log_verbose_level": 0}, **kw),
                     lambda **kw: client.register_system_shared_memory(region.name, f"/{region.name}", 64, **kw)):
            with pytest.raises(InferenceServerException) as without:
                call()
            assert (str(without.value.status()), without.value.message()) == refused
            call(headers=header)  # the same call, with the header: accepted
        status = client.get_system_shared_memory_status(headers=header)
        assert region.name in re.sub(r"\s", "", str(status))
        client.unregister_system_shared_memory(region.name, headers=header)
    finally:
        region.close()
        region.unlink()
    request = module.InferInput("features", [1, 16], "FP32")
    request.set_data_from_numpy(np.ones((1, 16), np.float32))
    assert client.infer("mlp_onnx", [request]).as_numpy("logits").shape == (1, 8)
    client.close()
