"""Sessions, deadlines and Latte's metrics through a real tritonserver."""

import time
import urllib.request

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from latte.examples import reference_runner


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_session_continues_its_prefix_and_ends(clients, example_repo, protocol):
    model = "sequence_onnx"
    reference = reference_runner(example_repo, model)
    sid = f"chat-{protocol}"
    first = np.array([[5, 6, 7]], np.int64)
    second = np.array([[8, 9]], np.int64)
    out1 = clients.infer(protocol, model, {"tokens": first}, parameters={"session_id": sid, "session_start": True})
    np.testing.assert_allclose(out1.as_numpy("embedding"), reference({"tokens": first})["embedding"], rtol=1e-5, atol=1e-6)
    out2 = clients.infer(protocol, model, {"tokens": second}, parameters={"session_id": sid, "session_end": True})
    whole = np.concatenate([first, second], axis=1)
    np.testing.assert_allclose(out2.as_numpy("embedding"), reference({"tokens": whole})["embedding"], rtol=1e-5, atol=1e-6)
    with pytest.raises(InferenceServerException, match=f"unknown session '{sid}'"):
        clients.infer(protocol, model, {"tokens": second}, parameters={"session_id": sid})


def test_a_request_whose_timeout_passes_before_it_runs_gets_a_timeout_error(clients):
    with pytest.raises(InferenceServerException, match="timed out"):
        clients.infer("grpc", "sequence_torchscript", {"tokens": np.ones((1, 8), np.int64)},
                      parameters={"timeout_ms": 0.0001})
    ok = clients.infer("grpc", "sequence_torchscript", {"tokens": np.ones((1, 8), np.int64)}, parameters={"timeout_ms": 10000})
    assert ok.as_numpy("embedding").shape == (1, 32)


def test_bad_request_parameters_are_refused_clearly(clients):
    with pytest.raises(InferenceServerException, match="'priority_level' must be an integer from 0 to 15"):
        clients.infer("http", "mlp_onnx", {"features": np.ones((1, 16), np.float32)}, parameters={"priority_level": 99})


def _scrape_until(url, predicate, timeout=15.0):
    """Latte publishes its series about once a second; poll the endpoint until they show."""
    deadline = time.monotonic() + timeout
    while True:
        text = urllib.request.urlopen(url).read().decode()
        if predicate(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.25)


def _success_count(text):
    """latte's count of mlp_onnx's successful requests, over its instances."""
    lines = [line for line in text.splitlines()
             if line.startswith("latte_requests_total") and 'model="mlp_onnx"' in line and 'outcome="success"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_latte_metrics_appear_next_to_tritons(server, clients, patient_model):
    before = _success_count(urllib.request.urlopen(server.metrics_url).read().decode())
    clients.infer("http", "mlp_onnx", {"features": np.ones((2, 16), np.float32)})
    clients.infer("http", patient_model, {"tokens": np.ones((1, 8), np.int64)})
    text = _scrape_until(server.metrics_url, lambda t: _success_count(t) > before and "latte_scheduler" in t)
    assert "nv_inference_request_success" in text
    for series in ("latte_requests_total", "latte_batch_size_bucket", "latte_request_duration_us_count",
                   "latte_sessions", "latte_arena_bytes", "latte_arena_fragmentation", "latte_arena_fragmented",
                   "latte_arena_fit_bytes", "latte_arena_failures", "latte_scheduler"):
        assert series in text, f"{series} missing from {server.metrics_url}"
    # At least this request: latte publishes its counters every few seconds, so requests of
    # earlier tests may show up in the same scrape.
    assert _success_count(text) >= before + 1
