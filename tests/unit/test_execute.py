"""LatteModel.execute as Triton calls it, on stand-ins for the stub's objects: one response
per request, in order, each bad request refused alone, and one call's figures counted once."""

import json

import numpy as np
import pytest

from example_models import example_model
from latte.backend.standin_stub import InferenceRequest, StandinStub, TritonError
from latte.examples import EXAMPLES


def load(repo, model, **parameters):
    return example_model(repo, model, **parameters)


@pytest.fixture(scope="module")
def mlp(example_repo):
    model = load(example_repo, "mlp_onnx")
    yield model
    model.finalize()


def counter(model, name, **labels):
    counters, _ = model.metrics.aggregate.snapshot()
    return counters.get((name, tuple(sorted(labels.items()))), 0.0)


def test_each_request_gets_its_own_response_in_order_and_a_bad_one_fails_alone(mlp):
    rng = np.random.default_rng(3)
    feeds = [EXAMPLES["mlp"].sample(rows, rng) for rows in (1, 2, 1)]
    bad = {"features": np.ones((1, 16), np.float64)}
    requests = [InferenceRequest(feeds[0]), InferenceRequest(bad), InferenceRequest(feeds[1]),
                InferenceRequest(feeds[2])]
    alone = [mlp.execute([InferenceRequest(f)])[0] for f in feeds]

    first, refused, second, third = mlp.execute(requests)

    assert refused.has_error() and refused.error().code() == TritonError.INVALID_ARG
    assert refused.error().message() == "input 'features': expected data type FP32, got FP64"
    for response, reference in zip((first, second, third), alone):
        assert not response.has_error()
        (got,), (want,) = response.output_tensors(), reference.output_tensors()
        np.testing.assert_allclose(got.as_numpy(), want.as_numpy(), rtol=1e-5, atol=1e-6)
    assert second.output_tensors()[0].as_numpy().shape[0] == 2


def test_a_call_is_counted_once_with_its_batches_and_outcomes(mlp):
    rng = np.random.default_rng(4)
    before = {name: counter(mlp, name) for name in ("latte_execute_calls_total", "latte_execute_requests_total",
                                                     "latte_batch_size_count")}
    ok_before = counter(mlp, "latte_requests_total", outcome="success")
    bad_before = counter(mlp, "latte_requests_total", outcome="bad_request")

    mlp.execute([InferenceRequest(EXAMPLES["mlp"].sample(1, rng)) for _ in range(3)]
                + [InferenceRequest({"features": np.ones((1, 3), np.float32)})])

    assert counter(mlp, "latte_execute_calls_total") == before["latte_execute_calls_total"] + 1
    assert counter(mlp, "latte_execute_requests_total") == before["latte_execute_requests_total"] + 4
    assert counter(mlp, "latte_batch_size_count") == before["latte_batch_size_count"] + 1  # one model call
    assert counter(mlp, "latte_requests_total", outcome="success") == ok_before + 3
    assert counter(mlp, "latte_requests_total", outcome="bad_request") == bad_before + 1


@pytest.mark.parametrize("broken_part, with_a_bad_request", [("planner.plan_requests", True), ("planner.plan", False),
                                                              ("runner.run", False)],
                         ids=["planning-a-call-read-by-request", "planning-a-call-read-by-input", "the-batch"])
def test_a_fault_outside_any_batch_answers_every_request_with_one_line(example_repo, broken_part, with_a_bad_request):
    model = load(example_repo, "mlp_onnx")
    try:
        def broken(*_):
            raise KeyError("batch lost")

        *path, name = broken_part.split(".")
        owner = model.engine
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, broken)
        rng = np.random.default_rng(5)
        requests = [InferenceRequest(EXAMPLES["mlp"].sample(1, rng)) for _ in range(2)]
        if with_a_bad_request:  # then the call is not plain: it is planned
            requests.append(InferenceRequest({"features": np.ones((1, 16), np.int32)}))
        responses = model.execute(requests)
        assert len(responses) == len(requests)
        for response in responses[:2]:
            assert response.error().code() == TritonError.INTERNAL
            assert response.error().message() == "model 'mlp_onnx' failed: KeyError: 'batch lost'"
        if with_a_bad_request:  # the request refused before the fault keeps its own answer
            assert responses[2].error().code() == TritonError.INVALID_ARG
    finally:
        model.finalize()


def test_early_answers_go_through_the_sender_and_leave_none_in_the_returned_list(example_repo):
    model = load(example_repo, "sequence_onnx", respond="per_batch", bucket_edges="16,128",
                 batch_planning="bucket")
    try:
        rng = np.random.default_rng(6)
        short = InferenceRequest(EXAMPLES["sequence"].sample(1, rng, length=8))
        long = InferenceRequest(EXAMPLES["sequence"].sample(1, rng, length=100))
        responses = model.execute([short, long])
        # Two buckets, two batches: the first finished is sent at once, the last rides back.
        sent = [r for r in (short, long) if r._sender is not None and r._sender.sent]
        assert len(sent) == 1
        (response, flags), = sent[0]._sender.sent
        assert flags == StandinStub.TRITONSERVER_RESPONSE_COMPLETE_FINAL and not response.has_error()
        returned = [r for r in responses if r is not None]
        assert len(returned) == 1 and responses[[short, long].index(sent[0])] is None
    finally:
        model.finalize()


def test_a_batch_is_not_sent_early_for_its_own_lower_priority_request(example_repo):
    """What is still to run decides: a finished batch of priorities 2 and 0, with only a
    priority-2 request left, holds no priority above it, and sends do not pay here."""
    model = load(example_repo, "sequence_onnx", respond="auto", bucket_edges="16,128", batch_planning="bucket")
    try:
        model.early.request_s, model.early.send_s = 0.0, 1.0  # a send costs more than a request's model time
        rng = np.random.default_rng(8)
        first, second, last = (InferenceRequest(EXAMPLES["sequence"].sample(1, rng, length=n),
                                                parameters=json.dumps({"priority_level": p}) if p else "{}")
                               for n, p in ((8, 2), (9, 0), (100, 2)))
        responses = model.execute([first, second, last])
        assert all(r._sender is None or not r._sender.sent for r in (first, second, last))
        assert all(response is not None and not response.has_error() for response in responses)
    finally:
        model.finalize()


def test_a_request_whose_sender_cannot_be_had_is_answered_with_the_call(example_repo):
    model = load(example_repo, "sequence_onnx", respond="per_batch", bucket_edges="16,128", batch_planning="bucket")
    try:
        rng = np.random.default_rng(9)
        short = InferenceRequest(EXAMPLES["sequence"].sample(1, rng, length=8))
        long = InferenceRequest(EXAMPLES["sequence"].sample(1, rng, length=100))

        def no_sender():
            raise RuntimeError("the stub has no sender for this request")

        short.get_response_sender = long.get_response_sender = no_sender
        responses = model.execute([short, long])
        assert len(responses) == 2 and all(r is not None and not r.has_error() for r in responses)
    finally:
        model.finalize()


def test_async_execute_answers_leave_highest_priority_first(example_repo):
    """execute returns at once; answers wait for the one sender thread, higher priority_level first."""
    import threading
    import time

    model = load(example_repo, "mlp_onnx", async_execute="true")
    sent, started, gate = [], threading.Event(), threading.Event()

    class Sender:
        def __init__(self, name, hold=False):
            self.name, self.hold = name, hold

        def send(self, response=None, flags=0):
            if self.hold:
                started.set()
                gate.wait(10)
            sent.append((self.name, response.has_error()))

    def request(name, priority=0, hold=False):
        parameters = json.dumps({"priority_level": priority}) if priority else "{}"
        r = InferenceRequest(EXAMPLES["mlp"].sample(1, np.random.default_rng(len(name))), parameters=parameters)
        r._sender = Sender(name, hold)
        return r

    try:
        assert model.execute([request("first", hold=True)]) is None
        assert started.wait(10)  # the sender thread is busy with the first answer
        model.execute([request("low-1"), request("low-2")])
        model.execute([request("high", priority=3)])
        deadline = time.monotonic() + 10
        while sum(len(batch) for _, _, batch, _ in list(model._outbox.queue)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # all three answers wait behind the held send
        gate.set()
        while len(sent) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [name for name, _ in sent] == ["first", "high", "low-1", "low-2"]
        assert not any(failed for _, failed in sent)
    finally:
        gate.set()
        model.finalize()



def test_a_plain_call_of_one_shape_answers_each_request_with_its_rows_of_one_batch(mlp):
    rng = np.random.default_rng(11)
    feeds = [EXAMPLES["mlp"].sample(rows, rng) for rows in (2, 1, 3)]
    alone = [mlp.execute([InferenceRequest(f)])[0].output_tensors()[0].as_numpy() for f in feeds]
    calls = counter(mlp, "latte_batch_size_count")

    responses = mlp.execute([InferenceRequest(f) for f in feeds])

    assert counter(mlp, "latte_batch_size_count") == calls + 1  # one model call for the three
    for response, want in zip(responses, alone):
        assert not response.has_error()
        np.testing.assert_allclose(response.output_tensors()[0].as_numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_name, example, parameters", [
    ("mlp_onnx", "mlp", {}),
    ("sequence_onnx", "sequence", {"respond": "per_call"}),  # ragged: planned batches, read by input
], ids=["one-shape", "ragged"])
def test_a_batch_the_model_fails_on_is_answered_request_by_request(example_repo, model_name, example, parameters):
    model = load(example_repo, model_name, **parameters)
    try:
        run = model.graph.steps[0].runtime.run

        def fails_on_batches(feed):
            if next(iter(feed.values())).shape[0] > 1:
                raise RuntimeError("kernel failed on a batch")
            return run(feed)

        model.graph.steps[0].runtime.run = fails_on_batches
        rng = np.random.default_rng(12)
        responses = model.execute([InferenceRequest(EXAMPLES[example].sample(1, rng)) for _ in range(3)])
        assert [r.has_error() for r in responses] == [False, False, False]
        assert counter(model, "latte_requests_total", outcome="success") == 3
    finally:
        model.finalize()


@pytest.fixture(scope="module")
def sequence(example_repo):
    # Answered with the call's return value.
    model = load(example_repo, "sequence_onnx", respond="per_call")
    yield model
    model.finalize()


def test_a_plain_call_of_ragged_requests_runs_the_plan_from_the_columns(sequence, monkeypatch):
    rng = np.random.default_rng(13)
    feeds = [EXAMPLES["sequence"].sample(1, rng, length=n) for n in (5, 90, 7, 120, 6)]
    alone = [sequence.execute([InferenceRequest(f)])[0].output_tensors()[0].as_numpy() for f in feeds]
    plan = sequence.engine.planner.plan([1] * 5, [5, 90, 7, 120, 6])
    calls = counter(sequence, "latte_batch_size_count")

    def general_path(*_):
        raise AssertionError("a plain call of ragged requests is not read request by request")

    monkeypatch.setattr(sequence.reader, "_read_items", general_path)
    responses = sequence.execute([InferenceRequest(f) for f in feeds])

    assert counter(sequence, "latte_batch_size_count") == calls + len(plan)  # one model call per planned batch
    assert sorted(i for batch in plan for i in batch) == [0, 1, 2, 3, 4]
    for response, want in zip(responses, alone):  # padding inside a batch changes no answer
        assert not response.has_error()
        np.testing.assert_allclose(response.output_tensors()[0].as_numpy(), want, rtol=1e-4, atol=1e-5)


def test_the_plan_of_a_plain_call_is_the_general_paths_plan(sequence):
    from latte.backend.requests import ParsedRequest

    lengths = [3, 64, 17, 128, 9, 40, 2, 100]
    rows = [1] * len(lengths)
    parsed = [(i, ParsedRequest({"tokens": np.ones((1, n), np.int64)}, 1, length=n)) for i, n in enumerate(lengths)]
    general = [[position for position, _ in batch] for batch in sequence.engine.planner.plan_requests(parsed)]
    assert sequence.engine.planner.plan(rows, lengths) == general


def test_a_plain_model_is_a_graph_of_one_model_step_whose_planner_plans_its_calls(sequence):
    (step,) = sequence.graph.steps
    assert (step.kind, step.name) == ("model", "sequence_onnx")
    assert sequence.engine.planner is step.planner  # one planner, the model's, wherever the model runs
    # The engine's figures are the step's: the graph keeps none beside them, nor adds to the ready line.
    rng = np.random.default_rng(3)
    sequence.execute([InferenceRequest(EXAMPLES["sequence"].sample(1, rng)) for _ in range(2)])
    assert sequence.graph.step_figures() == {} and sequence.graph.describe() == ""
    assert counter(sequence, "latte_batch_size_count") > 0



class CountingRuntime:
    """Wraps a model's graph: counts the batches it runs by their first feature, and fails
    every batch that holds a row whose first feature is FAILS."""

    FAILS = 99.0

    def __init__(self, graph):
        self.graph = graph
        self.runs = []  # the first features of each batch run, in order

    def __getattr__(self, name):
        return getattr(self.graph, name)

    def run_batch(self, batch):
        firsts = batch.inputs["features"][:, 0].tolist()
        self.runs.append(firsts)
        if self.FAILS in firsts:
            raise RuntimeError("the model fails on this row")
        return self.graph.run_batch(batch)


def marked_requests(marks, rows=32):
    """One request of `rows` rows per mark, every row's first feature the mark."""
    requests = []
    for mark in marks:
        features = np.zeros((rows, 16), np.float32)
        features[:, 0] = mark
        requests.append(InferenceRequest({"features": features}))
    return requests


def test_a_call_whose_second_batch_fails_runs_its_first_batch_once(example_repo):
    model = load(example_repo, "mlp_onnx", warmup="false")
    try:
        counting = model.engine.runner.graph = CountingRuntime(model.engine.runner.graph)
        # 64 rows a batch: the plan is [1, 2] then [3, 99], and only the second batch fails.
        responses = model.execute(marked_requests([1.0, 2.0, 3.0, CountingRuntime.FAILS]))

        assert [r.has_error() for r in responses] == [False, False, False, True]
        assert "the model fails on this row" in responses[3].error().message()
        first_batch_runs = [run for run in counting.runs if 1.0 in run or 2.0 in run]
        assert len(first_batch_runs) == 1  # the batch that succeeded is not run again
        # The failed batch ran once whole, then each of its requests alone.
        assert [sorted(set(run)) for run in counting.runs[1:]] == [[3.0, 99.0], [3.0], [99.0]]
    finally:
        model.finalize()


def test_a_failed_batch_shows_as_failed_in_the_metrics(example_repo):
    model = load(example_repo, "mlp_onnx", warmup="false")
    try:
        model.engine.runner.graph = CountingRuntime(model.engine.runner.graph)
        served = counter(model, "latte_batch_size_count")
        model.execute(marked_requests([1.0, 2.0, 3.0, CountingRuntime.FAILS]))

        assert counter(model, "latte_failed_batches_total") == 2  # [3, 99] as a batch, then [99] alone
        assert counter(model, "latte_batch_size_count") == served + 2  # [1, 2] and [3] served
        assert counter(model, "latte_requests_total", outcome="model_error") == 1
        assert counter(model, "latte_requests_total", outcome="success") == 3
    finally:
        model.finalize()

@pytest.mark.parametrize("parameters", [{}, {"async_execute": "true"}], ids=["inline", "async_execute"])
def test_a_session_turn_whose_response_cannot_be_built_leaves_the_session_as_it_was(example_repo, parameters):
    import time
    import types

    model = load(example_repo, "sequence_onnx", session_input="tokens", **parameters)

    def turn(tokens, **options):
        request = InferenceRequest({"tokens": np.array([tokens], np.int64)},
                                   parameters=json.dumps({"session_id": "s", **options}))
        responses = model.execute([request])
        if responses is not None:
            return responses[0]
        sent = request.get_response_sender().sent
        deadline = time.monotonic() + 10
        while not sent and time.monotonic() < deadline:
            time.sleep(0.01)
        return sent[0][0]

    def cannot_carry(name, array):
        raise TypeError("an output Triton cannot carry")

    try:
        assert not turn([5, 6], session_start=True).has_error()
        working = model.responses.pb
        model.responses.pb = types.SimpleNamespace(Tensor=cannot_carry, InferenceResponse=working.InferenceResponse,
                                                   TritonError=working.TritonError)
        failed = turn([7])
        assert failed.has_error() and "could not build the response" in failed.error().message()
        model.responses.pb = working
        # The session continues from the turn before the one whose answer never left: its next
        # turn answers as [7] sent again would.
        again = turn([7]).output_tensors()[0].as_numpy()
        fresh = load(example_repo, "sequence_onnx", session_input="tokens", **parameters)
        try:
            model, kept = fresh, model
            turn([5, 6], session_start=True)
            expected = turn([7]).output_tensors()[0].as_numpy()
        finally:
            model = kept
            fresh.finalize()
        np.testing.assert_allclose(again, expected, rtol=1e-5, atol=1e-6)
        assert model.sessions.in_flight() == 0
    finally:
        model.finalize()
