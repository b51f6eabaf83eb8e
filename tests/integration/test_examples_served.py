"""Every example model, over HTTP and gRPC, equals the same model run in-process."""

import numpy as np
import pytest

from latte.examples import EXAMPLES, reference_runner

MODELS = [f"{name}_{runtime}" for name in EXAMPLES for runtime in ("torchscript", "onnx")]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", MODELS)
def test_served_output_equals_in_process_output(clients, example_repo, manifest, model, protocol, rng):
    example = EXAMPLES[manifest[model]["example"]]
    reference = reference_runner(example_repo, model)
    for rows in (1, 5):
        feed = example.sample(rows, rng)
        result = clients.infer(protocol, model, feed)
        name = example.outputs[0].name
        got = result.as_numpy(name)
        assert got.shape == (rows, *example.outputs[0].dims)
        np.testing.assert_allclose(got, reference(feed)[name], rtol=1e-5, atol=1e-6)


def _stats(client, model):
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def test_concurrent_ragged_requests_are_batched_and_each_gets_its_own_answer(server, clients, example_repo, rng,
                                                                           patient_model):
    """The dynamic batcher hands several lengths to one execute; padding must not change any
    answer, and an over-long sequence in the burst fails alone."""
    import tritonclient.http as httpclient

    example = EXAMPLES["sequence"]
    reference = reference_runner(example_repo, "sequence_onnx")
    http = httpclient.InferenceServerClient(server.http_url, concurrency=16)
    batched = False
    seen = []
    for _ in range(3):
        feeds = [example.sample(1, rng, length=int(n)) for n in rng.integers(1, 129, size=47)]
        too_long = 20
        feeds.insert(too_long, {"tokens": np.ones((1, 129), np.int64)})
        before = _stats(http, patient_model)
        pending = [http.async_infer(patient_model, clients.inputs("http", feed)) for feed in feeds]
        for i, (feed, handle) in enumerate(zip(feeds, pending)):
            if i == too_long:
                with pytest.raises(Exception, match="length 129 exceeds this model's maximum of 128"):
                    handle.get_result()
                continue
            got = handle.get_result().as_numpy("embedding")
            np.testing.assert_allclose(got, reference(feed)["embedding"], rtol=1e-5, atol=1e-6)
        inferences, executions = (a - b for a, b in zip(_stats(http, patient_model), before))
        assert inferences == len(feeds)  # Triton counts the request answered with an error too
        seen.append((inferences, executions))
        if executions < inferences:
            batched = True
            break
    http.close()
    assert batched, f"requests of different lengths were never batched together: (requests, executions) {seen}"
