"""Triton's response cache in front of a latte model: a repeated request is answered without running it."""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest

from conftest import assert_stopped_promptly

# latte answers with execute's return value (respond: per_call) or through each request's response
# sender (per_batch, also what async_execute: true uses); Triton caches both.
CACHED = {"per_call": "mlp_cached", "per_batch": "mlp_cached_sender"}


@pytest.fixture(scope="module")
def cached_server(example_repo, tmp_path_factory):
    """The ONNX MLP example with `response_cache { enable: true }`; the server gets a cache because of it."""
    from latte.examples import EXAMPLES, model_context
    from latte.generator.model_folder import write_model
    from latte.triton import TritonServer
    from latte.triton.cache import DEFAULT_CACHE_BYTES, cache_flag

    work = tmp_path_factory.mktemp("cache")
    for respond, name in CACHED.items():
        context = model_context(EXAMPLES["mlp"], "onnx", "model.onnx")
        context.update(name=name, response_cache=True)
        context["parameters"] = {**context["parameters"], "respond": respond}
        write_model(work / "repository", context, {"model.onnx": example_repo / "mlp_onnx" / "1" / "model.onnx"})
    server = TritonServer(work / "repository", log_path=work / "tritonserver.log")
    assert cache_flag(DEFAULT_CACHE_BYTES) in server.command()
    with server:
        yield server
    assert_stopped_promptly(server)


def stats(client, model: str) -> dict:
    """Triton's counts for MODEL: cache hits and misses, successes, and how often the model ran."""
    (entry,) = client.get_inference_statistics(model)["model_stats"]
    inference = entry["inference_stats"]
    return {"hits": inference["cache_hit"]["count"], "misses": inference["cache_miss"]["count"],
            "successes": inference["success"]["count"], "executions": entry["execution_count"]}


def metric(server, name: str, model: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=5).read().decode()
    match = re.search(rf'^{name}{{[^}}]*model="{model}"[^}}]*}} ([0-9.e+]+)$', text, re.MULTILINE)
    assert match, f"{name} for {model} is not among the server's metrics"
    return float(match.group(1))


def infer(client, model: str, features: np.ndarray) -> np.ndarray:
    import tritonclient.http as httpclient

    from latte.triton.client import infer_inputs

    return client.infer(model, infer_inputs(httpclient, {"features": features})).as_numpy("logits")


@pytest.mark.parametrize("respond", sorted(CACHED))
def test_a_repeated_request_is_answered_from_the_cache(cached_server, same_output, respond):
    import tritonclient.http as httpclient

    model = CACHED[respond]
    client = httpclient.InferenceServerClient(cached_server.http_url)
    features = np.random.default_rng(7).standard_normal((1, 16)).astype(np.float32)
    first = infer(client, model, features)
    before = stats(client, model)
    for _ in range(5):
        same_output(infer(client, model, features), first, (1, 8), np.float32, "logits")
    after = stats(client, model)

    assert after["hits"] - before["hits"] == 5
    assert after["executions"] == before["executions"]          # the model did not run again
    assert after["successes"] - before["successes"] == 5
    assert metric(cached_server, "nv_cache_num_hits_per_model", model) >= 5

    # Another input is a miss: the model runs for it, once.
    infer(client, model, features + 1)
    other = stats(client, model)
    assert other["misses"] == after["misses"] + 1
    assert other["executions"] == after["executions"] + 1
    client.close()
