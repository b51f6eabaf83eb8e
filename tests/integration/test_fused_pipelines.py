"""End to end: the example pipelines (text, image, branching) generated twice from one spec,
fused (as `latte generate` renders them) and as Triton's ensemble (`--no-fuse`), served side by
side by one real tritonserver; clients get the same answers from both, over HTTP and gRPC."""

import numpy as np
import pytest

from conftest import assert_stopped_promptly

pytestmark = pytest.mark.integration

TEXTS = [b"the quick brown fox jumps over the lazy dog", b"hello", b"latte serves ragged batches of text"]
# What one request (one row) gets back: {output: (shape, dtype)}.
TEXT_OUTPUTS = {"EMBEDDING": ((1, 32), np.float32), "NORM": ((1, 1), np.float32)}
IMAGE_OUTPUTS = {"CLASSES": ((1, 3), np.int64), "PROBS": ((1, 3), np.float32)}
BRANCHING_OUTPUTS = {**TEXT_OUTPUTS, "TOPICS": ((1, 4), np.float32)}


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    import shutil

    from latte.examples.pipeline import side_by_side
    from latte.generator.validate import validate_repository
    from latte.triton import TritonServer

    work = tmp_path_factory.mktemp("pipelines")
    repo, names = side_by_side(work / "text", "text")
    names = {"text": names}
    for other in ("image", "branching"):
        other_repo, names[other] = side_by_side(work / other, other)
        for model in other_repo.iterdir():
            if model.is_dir() and not (repo / model.name).exists():  # branching shares text's steps
                shutil.copytree(model, repo / model.name)
    validate_repository(repo)
    with TritonServer(repo, log_path=work / "tritonserver.log") as server:
        yield server, repo, work, names
    assert_stopped_promptly(server)


def infer(client_module, client, model, name, array):
    request = client_module.InferInput(name, list(array.shape), "BYTES")
    request.set_data_from_numpy(array)
    return client.infer(model, [request])


def test_the_fused_text_pipeline_answers_as_its_ensemble_and_its_steps_do(pipelines, same_output):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from latte.examples.pipeline import InProcess

    server, _, work, names = pipelines
    reference = InProcess(work / "text" / "files", "text")
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    # One request at a time: the same computation in both, bit for bit.
    for text in TEXTS:
        one = np.array([[text]], dtype=object)
        fused = infer(grpcclient, grpc, names["text"]["fused"], "TEXT", one)
        ensemble = infer(grpcclient, grpc, names["text"]["ensemble"], "TEXT", one)
        for output, (shape, dtype) in TEXT_OUTPUTS.items():
            same_output(fused.as_numpy(output), ensemble.as_numpy(output), shape, dtype, (text, output))
    # One request carrying a batch of texts of different lengths, over HTTP.
    batch = np.array([[t] for t in TEXTS], dtype=object)
    result = infer(httpclient, http, names["text"]["fused"], "TEXT", batch)
    expected = reference({"TEXT": batch})
    np.testing.assert_allclose(result.as_numpy("EMBEDDING"), expected["EMBEDDING"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("NORM"), expected["NORM"], rtol=1e-4, atol=1e-5)
    # Single-text requests in flight together: the fused model batches them.
    pool = httpclient.InferenceServerClient(server.http_url, concurrency=len(TEXTS))
    pending = []
    for text in TEXTS:
        one = np.array([[text]], dtype=object)
        request = httpclient.InferInput("TEXT", [1, 1], "BYTES")
        request.set_data_from_numpy(one)
        pending.append((one, pool.async_infer(names["text"]["fused"], [request])))
    for one, future in pending:
        got = future.get_result().as_numpy("EMBEDDING")
        np.testing.assert_allclose(got, reference({"TEXT": one})["EMBEDDING"], rtol=1e-4, atol=1e-5)
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    for client in (http, grpc, pool):
        client.close()


@pytest.mark.parametrize("pipeline,tensor,outputs,seed", [
    ("image", "IMAGE", IMAGE_OUTPUTS, 9),             # image bytes in
    ("branching", "TEXT", BRANCHING_OUTPUTS, 10),     # both heads of one encoder
])
def test_a_fused_pipeline_answers_as_its_ensemble_bit_for_bit(pipelines, same_output, pipeline, tensor, outputs,
                                                              seed):
    import tritonclient.grpc as grpcclient

    from latte.examples.pipeline import PIPELINES

    server, _, _, names = pipelines
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for request in PIPELINES[pipeline].requests(4, seed=seed):
        fused = infer(grpcclient, grpc, names[pipeline]["fused"], tensor, request[tensor])
        ensemble = infer(grpcclient, grpc, names[pipeline]["ensemble"], tensor, request[tensor])
        for output, (shape, dtype) in outputs.items():
            same_output(fused.as_numpy(output), ensemble.as_numpy(output), shape, dtype, output)


def test_bad_input_to_a_fused_model_gets_one_line_and_the_code_its_ensemble_gives(pipelines):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    server, _, _, names = pipelines
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    not_an_image = np.array([[b"P5 not a colour image"]], dtype=object)
    for model in (names["image"]["fused"], names["image"]["ensemble"]):
        with pytest.raises(InferenceServerException) as refused:
            infer(grpcclient, grpc, model, "IMAGE", not_an_image)
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "not an 8-bit binary PPM image" in refused.value.message()
        assert "\n" not in refused.value.message() and "Traceback" not in refused.value.message()
    wrong_type = grpcclient.InferInput("IMAGE", [1, 1], "FP32")
    wrong_type.set_data_from_numpy(np.zeros((1, 1), np.float32))
    with pytest.raises(InferenceServerException) as refused:
        grpc.infer(names["image"]["fused"], [wrong_type])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    # The server still serves.
    from latte.examples.pipeline import PIPELINES

    (request,) = PIPELINES["image"].requests(1)
    assert infer(grpcclient, grpc, names["image"]["fused"], "IMAGE", request["IMAGE"]).as_numpy("CLASSES").shape == (1, 3)


def test_each_fused_step_is_a_prometheus_series(pipelines):
    import time

    from latte.bench.prometheus_scrape import scrape, total

    server, _, _, names = pipelines
    deadline = time.time() + 10
    while time.time() < deadline:  # latte publishes its figures once a second
        values = scrape(server.metrics_url)
        found = {step: total(values, "latte_step_us_total", model=names["text"]["fused"], step=step)
                 for step in ("tokenize", "encoder", "normalize")}
        if all(found.values()):
            break
        time.sleep(0.5)
    assert all(v and v > 0 for v in found.values()), found
    assert total(values, "latte_step_rows_total", model=names["text"]["fused"], step="encoder") >= len(TEXTS)


def test_verify_drives_the_fused_model_at_the_ensembles_planned_rate(pipelines):
    from latte.generator.operating_point import read_operating_points
    from latte.generator.verify import verify

    server, repo, _, names = pipelines
    report = verify(repo, names["text"]["fused"], 50, url=server.grpc_url, measurement_ms=1000)
    assert report.rate == read_operating_points(repo)["embed_text"].rate and report.concurrency is None
    assert report.throughput > 0 and 0 < report.p50_ms <= report.p99_ms
    assert report.slo_met == (report.p99_ms <= 50)
    assert "embed_text: P99" in report.text()


@pytest.fixture(scope="module")
def hand_written(tmp_path_factory):
    """A hand-written repository (python steps, a latte encoder, an ensemble) and its fused copy,
    both served by one tritonserver: the ensemble as embed_text, the fused model as embed_text_fused."""
    from fused_copies import fused_beside_ensemble
    from latte.examples.pipeline import write_hand_written_repository
    from latte.triton import TritonServer

    work = tmp_path_factory.mktemp("hand-written")
    served = fused_beside_ensemble(work, write_hand_written_repository(work / "repo", "latte"), "embed_text")
    with TritonServer(served, log_path=work / "tritonserver.log") as server:
        yield server
    assert_stopped_promptly(server)


def test_latte_fuse_on_a_hand_written_repository_answers_bit_for_bit_as_its_ensemble(hand_written, same_output):
    import tritonclient.grpc as grpcclient

    grpc = grpcclient.InferenceServerClient(hand_written.grpc_url)
    for text in TEXTS + [b"", b"one more text to embed " * 20]:
        one = np.array([[text]], dtype=object)
        fused = infer(grpcclient, grpc, "embed_text_fused", "TEXT", one)
        ensemble = infer(grpcclient, grpc, "embed_text", "TEXT", one)
        for output, (shape, dtype) in TEXT_OUTPUTS.items():
            same_output(fused.as_numpy(output), ensemble.as_numpy(output), shape, dtype, (text, output))


def test_tune_measures_a_fused_model_against_the_ensembles_slo(pipelines):
    from latte.generator.tune import tune

    _, repo, _, names = pipelines
    before = (repo / names["text"]["fused"] / "config.pbtxt").read_text()
    # No moves: the generated fused config alone, in closed loop and at the ensemble's planned rate.
    result = tune(repo, names["text"]["fused"], max_steps=0, measurement_ms=500)
    start = result.start
    assert result.best is start and start.error is None and start.score > 0
    assert start.poisson_p99_ms is not None
    assert (repo / names["text"]["fused"] / "config.pbtxt").read_text() == before
