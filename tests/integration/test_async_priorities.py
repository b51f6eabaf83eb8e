"""Priorities that latte holds: a model with `async_execute: true` queues requests in its own
scheduler, so a request's `priority_level` overtakes what is queued, and a full queue
(`max_queue_size`) sheds the lowest priority first, with UNAVAILABLE, over gRPC.

The model is the priority probe's ONNX graph at one length, one request per model call of
tens of milliseconds, behind a queue of 4 and no Triton priority levels. A flood of 16
default-priority requests fills the queue; the refusals coming back show it is full, and two
high-priority requests are sent then. They run before the default ones still queued, and
each sheds a queued default one if the queue is still full.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conftest import assert_stopped_promptly
from priority_probe import priority_probe_onnx, priority_probe_reference

MODEL = "async_probe"
LENGTH = 640          # one model call takes tens of milliseconds, so the queue stays full a while
QUEUE = 4
FLOOD = 16
HIGH = 1


@pytest.fixture(scope="module")
def async_server(tmp_path_factory):
    import onnx

    from latte.triton import TritonServer

    work = tmp_path_factory.mktemp("async_execute")
    repo = work / "repository"
    (repo / MODEL / "1").mkdir(parents=True)
    onnx.save(priority_probe_onnx(), str(repo / MODEL / "1" / "model.onnx"))
    (repo / MODEL / "config.pbtxt").write_text(f"""name: "{MODEL}"
backend: "latte"
max_batch_size: 1
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {LENGTH} ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters [
  {{ key: "async_execute" value: {{ string_value: "true" }} }},
  {{ key: "max_queue_size" value: {{ string_value: "{QUEUE}" }} }},
  {{ key: "intra_op_threads" value: {{ string_value: "1" }} }},
  {{ key: "warmup" value: {{ string_value: "false" }} }}
]
""")
    with TritonServer(repo, log_path=work / "tritonserver.log") as running:
        yield running
    assert_stopped_promptly(running)


class Answers:
    """Each request's one answer and the order the answers arrived in."""

    def __init__(self) -> None:
        self.by_request = {}
        self.order = []
        self.lock = threading.Condition()

    def callback(self, name: str):
        def record(result, error) -> None:
            with self.lock:
                assert name not in self.by_request, f"{name} answered twice"
                self.by_request[name] = error if error is not None else result.as_numpy("y")
                self.order.append(name)
                self.lock.notify_all()
        return record

    def wait(self, predicate, timeout_s: float = 60.0) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: predicate(self), timeout_s)

    def served(self) -> list:
        with self.lock:
            return [n for n in self.order if not isinstance(self.by_request[n], Exception)]

    def failed(self, prefix: str):
        with self.lock:
            return {n: e for n, e in self.by_request.items() if n.startswith(prefix) and isinstance(e, Exception)}


def test_high_priority_overtakes_the_queued_flood_and_the_default_class_is_shed(async_server, rng):
    import tritonclient.grpc as grpcclient

    from latte.triton.client import infer_inputs

    client = grpcclient.InferenceServerClient(async_server.grpc_url)
    x = rng.uniform(-0.2, 0.2, (1, LENGTH)).astype(np.float32)
    answers = Answers()
    try:
        for i in range(FLOOD):
            client.async_infer(MODEL, infer_inputs(grpcclient, {"x": x}), answers.callback(f"default{i}"))
        # Refusals come back at once: the queue of 4 is full, a few model calls of work ahead.
        assert answers.wait(lambda a: len(a.failed("default")) >= FLOOD // 2), answers.by_request
        served_before_the_highs = len(answers.served())
        for i in range(2):
            client.async_infer(MODEL, infer_inputs(grpcclient, {"x": x}), answers.callback(f"high{i}"),
                               parameters={"priority_level": HIGH})
        assert answers.wait(lambda a: len(a.by_request) == FLOOD + 2), answers.by_request
    finally:
        client.close()

    assert sorted(answers.by_request) == sorted([f"default{i}" for i in range(FLOOD)] + ["high0", "high1"])
    for name in ("high0", "high1"):
        np.testing.assert_allclose(answers.by_request[name], priority_probe_reference(x), rtol=1e-4, atol=1e-5)

    refused = answers.failed("default")
    assert all(e.status() == "StatusCode.UNAVAILABLE" for e in refused.values()), refused
    full = [e for e in refused.values() if "its queue is full (max_queue_size=4) of requests of priority_level 0" in e.message()]
    shed = [e for e in refused.values() if "was shed from its full queue (max_queue_size=4) for one of a higher "
            "priority_level" in e.message()]
    assert len(full) + len(shed) == len(refused) and len(full) >= FLOOD // 2
    assert 1 <= len(shed) <= 2, [e.message() for e in refused.values()]
    assert all("\n" not in e.message() for e in refused.values())

    served = answers.served()
    last_high = max(served.index("high0"), served.index("high1"))
    # Before the highs: what was answered when they were sent, the one call a lane had
    # started, and one answer still on its way back; none of the queued ones.
    assert last_high <= served_before_the_highs + 3, (served_before_the_highs, served)
    # After them: default requests that were queued before them.
    assert len(served) - 1 - last_high >= 1, served


def test_the_server_still_serves_after_the_flood(async_server, rng):
    import tritonclient.grpc as grpcclient

    from latte.triton.client import infer_inputs

    client = grpcclient.InferenceServerClient(async_server.grpc_url)
    try:
        x = rng.uniform(-0.2, 0.2, (1, LENGTH)).astype(np.float32)
        started = time.monotonic()
        y = client.infer(MODEL, infer_inputs(grpcclient, {"x": x})).as_numpy("y")
        assert time.monotonic() - started < 30
        np.testing.assert_allclose(y, priority_probe_reference(x), rtol=1e-4, atol=1e-5)
    finally:
        client.close()
