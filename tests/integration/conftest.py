"""A real tritonserver on the example repository, shared by the integration tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Every test under tests/integration starts a real tritonserver (or needs one started): each
    carries the `integration` mark, whether its file says so or not, so that `-m "not integration"`
    leaves none of them in. (A `pytestmark` in a conftest marks nothing.) First, before `-m`
    selects: this hook sees the whole session's items, so only this folder's are marked."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


PATIENT_MODEL = "sequence_patient"
# A stop held up this long waited for something that never went (a client's open connection,
# a model that would not unload) until tritonserver's exit timeout (30 s), not for models
# unloading slowly on a busy machine.
HELD_UP_S = 15


def assert_stopped_promptly(server) -> None:
    held = [(what, seconds) for what, seconds in server.stop_waited if seconds >= HELD_UP_S]
    assert not held, f"tritonserver's stop waited for {held} (log {server.log_path})"


@pytest.fixture(scope="session")
def server(example_repo, tmp_path_factory):
    """The example repository plus `sequence_patient`: the ONNX sequence model on two
    scheduler lanes behind a dynamic batcher that waits up to 100 ms, so that requests sent
    from Python (about a millisecond apart) are certain to share batches."""
    import shutil

    from latte.examples import EXAMPLES, model_context
    from latte.generator.model_folder import write_model
    from latte.triton import TritonServer
    from priority_probe import write_priority_probes

    work = tmp_path_factory.mktemp("server")
    repo = work / "repository"
    shutil.copytree(example_repo, repo)
    context = model_context(EXAMPLES["sequence"], "onnx", "model.onnx")
    context.update(name=PATIENT_MODEL, dynamic_batching={"max_queue_delay_microseconds": 100000})
    # Two lanes: its batches go through the AffinityScheduler, whose figures the metrics test reads.
    context["parameters"] = {**context["parameters"], "lanes": "2"}
    write_model(repo, context, {"model.onnx": example_repo / "sequence_onnx" / "1" / "model.onnx"})
    write_priority_probes(repo)  # test_priorities.py's models
    with TritonServer(repo, log_path=work / "tritonserver.log") as running:
        yield running
    assert_stopped_promptly(running)


@pytest.fixture(scope="session")
def patient_model(server) -> str:
    return PATIENT_MODEL


@pytest.fixture(scope="session")
def manifest(example_repo):
    return json.loads((example_repo / "examples.json").read_text())


class Clients:
    """One tritonclient per protocol, with a helper that sends numpy feeds."""

    def __init__(self, server):
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        self.modules = {"http": httpclient, "grpc": grpcclient}
        self.clients = {"http": httpclient.InferenceServerClient(server.http_url),
                        "grpc": grpcclient.InferenceServerClient(server.grpc_url)}

    def close(self) -> None:
        # tritonserver waits for open HTTP connections as it stops, up to its exit timeout (30 s)
        for client in self.clients.values():
            client.close()

    def inputs(self, protocol, feed):
        from latte.triton.client import infer_inputs

        return infer_inputs(self.modules[protocol], feed)

    def infer(self, protocol, model, feed, **kwargs):
        return self.clients[protocol].infer(model, self.inputs(protocol, feed), **kwargs)


@pytest.fixture(scope="session")
def clients(server):
    opened = Clients(server)
    yield opened
    opened.close()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def assert_same_output(got, want, shape, dtype, what) -> None:
    """Two answers' arrays for one output (as tritonclient's as_numpy gives them): each there,
    of `shape` and `dtype`, and equal bit for bit.

    as_numpy gives None for an output its response lacks, and np.array_equal(None, None) is
    True: without the first check, two answers missing the same output would pass as equal."""
    for which, array in (("first", got), ("second", want)):
        assert array is not None, f"{what}: missing from the {which} answer"
        assert array.shape == tuple(shape) and array.dtype == np.dtype(dtype), (
            f"{what}: the {which} answer is {array.dtype} {list(array.shape)}, expected {np.dtype(dtype)} {list(shape)}")
    assert np.array_equal(got, want), what


@pytest.fixture(scope="session")
def same_output():
    """assert_same_output, for the tests that compare served answers bit for bit."""
    return assert_same_output

