"""The engine's batches on the AffinityScheduler's lanes: same answers, one answer each."""

import itertools

import numpy as np

from latte.backend.engine import DeadlineExceeded
from latte.backend.lanes import LaneDispatcher
from latte.backend.options import RequestOptions
from latte.backend.requests import ParsedRequest
from latte.examples import EXAMPLES, reference_runner

from test_engine import engine_for


def test_two_lanes_answer_every_request_like_the_model_in_process(example_repo):
    spec, engine = engine_for(example_repo, "sequence_onnx")
    engine.dispatcher = LaneDispatcher(engine, lanes=2)
    try:
        rng = np.random.default_rng(9)
        feeds = [EXAMPLES["sequence"].sample(1, rng) for _ in range(40)]
        results = engine.infer([ParsedRequest(inputs=f, rows=1) for f in feeds])
        reference = reference_runner(example_repo, "sequence_onnx")
        for feed, result in zip(feeds, results):
            np.testing.assert_allclose(result["embedding"], reference(feed)["embedding"], rtol=1e-5, atol=1e-6)
        figures = engine.dispatcher.metrics()
        assert figures["completed"] == 40
        assert figures["batches"] < 40  # requests of one bucket shared batches
        busy = [figures["lane0_utilization"], figures["lane1_utilization"]]
        assert all(0.0 <= u <= 1.0 for u in busy) and sum(busy) > 0
    finally:
        engine.dispatcher.close()


def test_an_expired_request_is_answered_once_with_a_timeout(example_repo):
    spec, engine = engine_for(example_repo, "mlp_onnx")
    engine.dispatcher = LaneDispatcher(engine, lanes=1)
    ticks = itertools.count(0.0, 1.0)
    engine.clock = lambda: next(ticks)  # every look at the clock is a second later
    try:
        feed = EXAMPLES["mlp"].sample(1, np.random.default_rng(0))
        request = ParsedRequest(inputs=feed, rows=1)
        ok, late = engine.infer([request, request], [RequestOptions(), RequestOptions(timeout_ms=1)])
        assert ok["logits"].shape == (1, 8)
        assert isinstance(late, DeadlineExceeded)
    finally:
        engine.dispatcher.close()


def test_lane_results_reach_the_calling_thread_one_by_one(example_repo):
    """Triton's response senders are used from the thread that runs `execute`."""
    import threading

    spec, engine = engine_for(example_repo, "sequence_onnx")
    engine.dispatcher = LaneDispatcher(engine, lanes=2)
    try:
        rng = np.random.default_rng(10)
        requests = [ParsedRequest(inputs=EXAMPLES["sequence"].sample(1, rng), rows=1) for _ in range(12)]
        seen = []
        results = engine.infer(requests, on_results=lambda outcomes: seen.extend(
            (pos, threading.get_ident()) for pos, _ in outcomes))
        assert sorted(pos for pos, _ in seen) == list(range(12))
        assert {thread for _, thread in seen} == {threading.get_ident()}
        assert all(r["embedding"].shape == (1, 32) for r in results)
    finally:
        engine.dispatcher.close()


def test_cost_planned_batches_on_the_lanes_answer_like_the_model_in_process(example_repo):
    from latte.backend.planning import CostModel

    spec, engine = engine_for(example_repo, "sequence_onnx", bucketed=True)
    # Calls dominate: the plan puts every request of the call into one batch, one affinity key.
    engine.cost_model = CostModel(2000.0, {e: float(e) for e in spec.serving.bucket_edges})
    records = []
    engine.on_batch = records.append
    engine.dispatcher = LaneDispatcher(engine, lanes=2)
    try:
        rng = np.random.default_rng(11)
        feeds = [EXAMPLES["sequence"].sample(1, rng, length=n) for n in (2, 30, 120, 9, 64, 65, 16, 17)]
        results = engine.infer([ParsedRequest(inputs=f, rows=1) for f in feeds])
        reference = reference_runner(example_repo, "sequence_onnx")
        for feed, result in zip(feeds, results):
            np.testing.assert_allclose(result["embedding"], reference(feed)["embedding"], rtol=1e-5, atol=1e-6)
        assert engine.dispatcher.metrics()["completed"] == len(feeds)
        assert sum(r.rows for r in records) == len(feeds)
    finally:
        engine.dispatcher.close()


def test_an_idle_lane_starts_with_the_most_urgent_request_and_reports_each_as_it_finishes(example_repo):
    from latte.backend.buckets import BucketPlan

    spec, engine = engine_for(example_repo, "sequence_onnx")
    engine.buckets = BucketPlan(spec.serving.bucket_edges)
    engine.dispatcher = LaneDispatcher(engine, lanes=1)
    try:
        # Three shape buckets, so three batches; the lane is idle when the call arrives.
        requests = [ParsedRequest(inputs={"tokens": np.ones((1, n), np.int64)}, rows=1) for n in (10, 40, 100)]
        heard = []
        engine.infer(requests, [RequestOptions(), RequestOptions(priority=2), RequestOptions(priority=7)],
                     on_results=lambda outcomes: heard.extend(position for position, _ in outcomes))
        assert heard == [2, 1, 0]
    finally:
        engine.dispatcher.close()


def test_submitted_calls_share_batches_and_each_request_gets_its_own_answer(example_repo):
    """Pipelined calls: requests of several execute calls (whose positions repeat) meet in one
    scheduler queue, may share a batch, and each answer reaches its own call."""
    import threading

    spec, engine = engine_for(example_repo, "sequence_onnx", bucketed=True)
    engine.dispatcher = LaneDispatcher(engine, lanes=1, max_window_s=0.005)
    reference = reference_runner(example_repo, "sequence_onnx")
    try:
        rng = np.random.default_rng(12)
        calls = [[EXAMPLES["sequence"].sample(1, rng, length=n) for n in lengths]
                 for lengths in ((5, 70), (6, 71, 9), (120,))]
        answers = [dict() for _ in calls]
        done = threading.Event()
        lock = threading.Lock()

        def collector(index):
            def on_results(outcomes):
                with lock:
                    answers[index].update(outcomes)
                    if sum(map(len, answers)) == sum(map(len, calls)):
                        done.set()
            return on_results

        for index, feeds in enumerate(calls):
            engine.submit([ParsedRequest(inputs=f, rows=1) for f in feeds], [None] * len(feeds), collector(index))
        assert done.wait(30.0)
        for feeds, answer in zip(calls, answers):
            assert sorted(answer) == list(range(len(feeds)))
            for position, feed in enumerate(feeds):
                np.testing.assert_allclose(answer[position]["embedding"], reference(feed)["embedding"],
                                           rtol=1e-5, atol=1e-6)
    finally:
        engine.dispatcher.close()
