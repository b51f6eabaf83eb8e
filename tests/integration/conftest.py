"""A real tritonserver on the example repository, shared by the integration tests."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def server(example_repo, tmp_path_factory):
    from latte.triton import TritonServer

    log = tmp_path_factory.mktemp("server") / "tritonserver.log"
    with TritonServer(example_repo, log_path=log) as running:
        yield running


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

    def inputs(self, protocol, feed):
        from latte.triton.client import infer_inputs

        return infer_inputs(self.modules[protocol], feed)

    def infer(self, protocol, model, feed, **kwargs):
        return self.clients[protocol].infer(model, self.inputs(protocol, feed), **kwargs)


@pytest.fixture(scope="session")
def clients(server):
    return Clients(server)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
