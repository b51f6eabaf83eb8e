"""Triton's response cache in front of a latte model: a repeated request is answered without running it."""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest

CACHED = "mlp_cached"


@pytest.fixture(scope="module")
def cached_server(example_repo, tmp_path_factory):
    """The ONNX MLP example with `response_cache { enable: true }`; the server gets a cache because of it."""
    from latte.examples import EXAMPLES, model_context
    from latte.generator.render import write_model
    from latte.triton import TritonServer
    from latte.triton.cache import DEFAULT_CACHE_BYTES, cache_flag

    work = tmp_path_factory.mktemp("cache")
    context = model_context(EXAMPLES["mlp"], "onnx", "model.onnx")
    context.update(name=CACHED, response_cache=True)
    write_model(work / "repository", context, {"model.onnx": example_repo / "mlp_onnx" / "1" / "model.onnx"})
    server = TritonServer(work / "repository", log_path=work / "tritonserver.log")
    assert cache_flag(DEFAULT_CACHE_BYTES) in server.command()
    with server:
        yield server


def stats(client):
    (model,) = client.get_inference_statistics(CACHED).model_stats
    return model


def metric(server, name: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    match = re.search(rf'^{name}{{[^}}]*model="{CACHED}"[^}}]*}} ([0-9.e+]+)$', text, re.MULTILINE)
    assert match, f"{name} for {CACHED} is not among the server's metrics"
    return float(match.group(1))


def infer(client, features: np.ndarray) -> np.ndarray:
    import tritonclient.http as httpclient

    from latte.triton.client import infer_inputs

    return client.infer(CACHED, infer_inputs(httpclient, {"features": features})).as_numpy("logits")


def test_a_repeated_request_is_answered_from_the_cache(cached_server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(cached_server.http_url)
    features = np.random.default_rng(7).standard_normal((1, 16)).astype(np.float32)
    first = infer(client, features)
    before = stats(client)
    for _ in range(5):
        np.testing.assert_array_equal(infer(client, features), first)
    after = stats(client)

    assert after.inference_stats.cache_hit.count - before.inference_stats.cache_hit.count == 5
    assert after.execution_count == before.execution_count          # the model did not run again
    assert after.inference_stats.success.count - before.inference_stats.success.count == 5
    assert metric(cached_server, "nv_cache_num_hits_per_model") >= 5

    # Another input is a miss: the model runs for it, once.
    infer(client, features + 1)
    other = stats(client)
    assert other.inference_stats.cache_miss.count == after.inference_stats.cache_miss.count + 1
    assert other.execution_count == after.execution_count + 1
