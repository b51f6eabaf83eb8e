"""The engine's batches on the AffinityScheduler's lanes: same answers, one answer each."""

import itertools
import threading
import time
from dataclasses import replace

import numpy as np

from latte.backend.engine import BatchEngine
from latte.backend.errors import DeadlineExceeded, Overloaded, error_class
from latte.backend.graph.graph import Graph
from latte.backend.graph.steps import ModelStep
from latte.backend.lanes import LaneDispatcher
from latte.backend.metrics import outcome_label
from latte.backend.options import DEFAULT_OPTIONS, RequestOptions, read_options
from latte.backend.requests import ParsedRequest, requests_call
from latte.backend.runtimes import Runtime
from latte.examples import EXAMPLES, reference_runner


def test_two_lanes_answer_every_request_like_the_model_in_process(example_repo, example_engine):
    spec, engine = example_engine("sequence_onnx")
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


def test_an_expired_request_is_answered_once_with_a_timeout(example_engine):
    spec, engine = example_engine("mlp_onnx")
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


def test_lane_results_reach_the_calling_thread_one_by_one(example_engine):
    """Triton's response senders are used from the thread that runs `execute`."""
    import threading

    spec, engine = example_engine("sequence_onnx")
    engine.dispatcher = LaneDispatcher(engine, lanes=2)
    try:
        rng = np.random.default_rng(10)
        requests = [ParsedRequest(inputs=EXAMPLES["sequence"].sample(1, rng), rows=1) for _ in range(12)]
        seen = []
        for answer in engine.answers(requests_call(requests)):
            seen.extend((pos, out, threading.get_ident()) for pos, out in zip(answer.positions, answer.outcomes()))
        assert sorted(pos for pos, _, _ in seen) == list(range(12))
        assert {thread for _, _, thread in seen} == {threading.get_ident()}
        assert all(out["embedding"].shape == (1, 32) for _, out, _ in seen)
    finally:
        engine.dispatcher.close()


def test_cost_planned_batches_on_the_lanes_answer_like_the_model_in_process(example_repo, example_engine):
    from latte.backend.planning import CostModel

    spec, engine = example_engine("sequence_onnx", bucketed=True)
    # Calls dominate: the plan puts every request of the call into one batch, one affinity key.
    engine.planner.cost_model = CostModel(2000.0, {e: float(e) for e in spec.serving.bucket_edges})
    engine.dispatcher = LaneDispatcher(engine, lanes=2)
    try:
        rng = np.random.default_rng(11)
        feeds = [EXAMPLES["sequence"].sample(1, rng, length=n) for n in (2, 30, 120, 9, 64, 65, 16, 17)]
        results = engine.infer([ParsedRequest(inputs=f, rows=1) for f in feeds])
        reference = reference_runner(example_repo, "sequence_onnx")
        for feed, result in zip(feeds, results):
            np.testing.assert_allclose(result["embedding"], reference(feed)["embedding"], rtol=1e-5, atol=1e-6)
        assert engine.dispatcher.metrics()["completed"] == len(feeds)
        assert sum(r.rows for r in engine.runner.take_records()) == len(feeds)
    finally:
        engine.dispatcher.close()


def test_an_idle_lane_starts_with_the_most_urgent_request_and_reports_each_as_it_finishes(example_engine):
    from latte.backend.buckets import BucketPlan

    spec, engine = example_engine("sequence_onnx")
    engine.planner.buckets = BucketPlan(spec.serving.bucket_edges)
    engine.dispatcher = LaneDispatcher(engine, lanes=1)
    try:
        # Three shape buckets, so three batches; the lane is idle when the call arrives.
        requests = [ParsedRequest(inputs={"tokens": np.ones((1, n), np.int64)}, rows=1) for n in (10, 40, 100)]
        options = [RequestOptions(), RequestOptions(priority=2), RequestOptions(priority=7)]
        heard = [position for answer in engine.answers(requests_call(requests, options)) for position in answer.positions]
        assert heard == [2, 1, 0]
    finally:
        engine.dispatcher.close()


def test_submitted_calls_share_batches_and_each_request_gets_its_own_answer(example_repo, example_engine):
    """Pipelined calls: requests of several execute calls (whose positions repeat) meet in one
    scheduler queue, may share a batch, and each answer reaches its own call."""
    import threading

    spec, engine = example_engine("sequence_onnx", bucketed=True)
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
            def on_results(outcomes, turns):
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


class GatedMlp(Runtime):
    """The mlp example's signature; each call waits until the gate opens. Records, in order,
    the first feature of every row it runs: the tests mark each request with it."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__(["features"], ["logits"])
        self.gate = gate
        self.started = threading.Event()
        self.ran: list = []

    def run(self, feed):
        self.started.set()
        assert self.gate.wait(30.0)
        self.ran.extend(int(row[0]) for row in feed["features"])
        return {"logits": np.zeros((feed["features"].shape[0], 8), np.float32)}


class PipelinedAnswers:
    """What async_execute calls (one request each) were answered with, in the order the answers
    came; a second answer to any request fails the test."""

    def __init__(self) -> None:
        self.outcomes: dict = {}
        self.order: list = []
        self._lock = threading.Condition()

    def to(self, call: int):
        def on_results(outcomes, turns):
            with self._lock:
                for position, outcome in outcomes:
                    assert (call, position) not in self.outcomes, f"call {call} answered twice"
                    self.outcomes[(call, position)] = outcome
                    self.order.append(call)
                self._lock.notify_all()
        return on_results

    def of(self, call: int):
        with self._lock:
            return self.outcomes.get((call, 0))

    def wait_for(self, count: int) -> None:
        with self._lock:
            assert self._lock.wait_for(lambda: len(self.outcomes) >= count, 30.0), self.outcomes


def async_mlp(example_engine, queue_capacity: int = 4096):
    """The mlp example's engine on one lane, one request per batch, behind a closed gate."""
    spec, _ = example_engine("mlp_onnx")
    gate = threading.Event()
    spec = replace(spec, signature=replace(spec.signature, max_batch_size=1))
    engine = BatchEngine(spec, Graph.of_step(ModelStep("mlp", spec, GatedMlp(gate))))
    engine.dispatcher = LaneDispatcher(engine, lanes=1, queue_capacity=queue_capacity)
    return engine, gate


def send(engine, answers: PipelinedAnswers, call: int, options: RequestOptions = DEFAULT_OPTIONS) -> None:
    """One request, marked with its call number, as one async_execute call."""
    features = np.full((1, 16), call, np.float32)
    engine.submit([ParsedRequest(inputs={"features": features}, rows=1)], [options], answers.to(call))


def test_a_higher_priority_level_overtakes_the_requests_queued_before_it(example_engine):
    engine, gate = async_mlp(example_engine)
    answers = PipelinedAnswers()
    try:
        send(engine, answers, 0)
        assert engine.runner.graph.steps[0].runtime.started.wait(10.0)  # the lane holds call 0; the rest queue
        for call in (1, 2, 3, 4):
            send(engine, answers, call)
        send(engine, answers, 5, RequestOptions(priority=3))
        gate.set()
        answers.wait_for(6)
    finally:
        gate.set()
        engine.dispatcher.close()
    assert engine.runner.graph.steps[0].runtime.ran == [0, 5, 1, 2, 3, 4]
    assert answers.order == [0, 5, 1, 2, 3, 4]
    assert all(not isinstance(outcome, Exception) for outcome in answers.outcomes.values())


def test_a_full_queue_sheds_the_lowest_priority_first_with_one_unavailable_line(example_engine):
    engine, gate = async_mlp(example_engine, queue_capacity=2)
    answers = PipelinedAnswers()
    high = RequestOptions(priority=1)
    try:
        send(engine, answers, 0)
        assert engine.runner.graph.steps[0].runtime.started.wait(10.0)
        send(engine, answers, 1)
        send(engine, answers, 2)         # the queue of two is full
        send(engine, answers, 3, high)   # sheds the newest default-priority request, at once
        shed = answers.of(2)
        send(engine, answers, 4)         # default priority cannot shed its own class
        refused = answers.of(4)
        send(engine, answers, 5, high)   # sheds the last default-priority request
        send(engine, answers, 6, high)   # nothing of a lower priority is left to shed
        refused_high = answers.of(6)
        assert engine.runner.graph.steps[0].runtime.ran == []  # all of the above was answered while the lane was held
        gate.set()
        answers.wait_for(7)
    finally:
        gate.set()
        engine.dispatcher.close()
    assert str(shed) == ("model 'mlp_onnx' is overloaded: the request was shed from its full queue "
                         "(max_queue_size=2) for one of a higher priority_level; retry later")
    assert str(refused) == ("model 'mlp_onnx' is overloaded: its queue is full (max_queue_size=2) of requests "
                            "of priority_level 0 or higher; retry later")
    assert "of priority_level 1 or higher" in str(refused_high)
    failed = {call for (call, _), outcome in answers.outcomes.items() if isinstance(outcome, Exception)}
    assert failed == {1, 2, 4, 6}
    assert answers.of(1) is not None and "shed from its full queue" in str(answers.of(1))
    assert {(error_class(answers.of(c)).code, outcome_label(answers.of(c))) for c in failed} == {("UNAVAILABLE", "overloaded")}
    assert engine.runner.graph.steps[0].runtime.ran == [0, 3, 5]


def test_requests_whose_deadline_passes_in_the_queue_time_out_without_running(example_engine):
    engine, gate = async_mlp(example_engine)
    answers = PipelinedAnswers()
    try:
        send(engine, answers, 0)
        assert engine.runner.graph.steps[0].runtime.started.wait(10.0)
        send(engine, answers, 1, read_options({"timeout_ms": 30}))
        send(engine, answers, 2, read_options({}, triton_timeout_us=30_000))  # Triton's own request timeout
        send(engine, answers, 3)
        time.sleep(0.1)
        gate.set()
        answers.wait_for(4)
    finally:
        gate.set()
        engine.dispatcher.close()
    for call in (1, 2):
        late = answers.of(call)
        assert isinstance(late, DeadlineExceeded), late
        assert str(late).startswith("timed out: timeout_ms=30 ran out before a lane could run the request (it waited ")
        assert error_class(late).code == "UNAVAILABLE"
    assert engine.runner.graph.steps[0].runtime.ran == [0, 3]


def test_a_request_the_full_queue_cannot_take_is_answered_overloaded_and_unavailable(example_engine):
    spec, engine = example_engine("mlp_onnx")
    gate = threading.Event()
    # The lane holds its first batch, so the queue stays full.
    engine.runner.graph = Graph.of_step(ModelStep("mlp", spec, GatedMlp(gate)))
    engine.dispatcher = LaneDispatcher(engine, lanes=1, queue_capacity=1)

    results = [None] * 4
    try:
        feed = EXAMPLES["mlp"].sample(1, np.random.default_rng(13))
        for answer in engine.answers(requests_call([ParsedRequest(inputs=feed, rows=1) for _ in range(4)])):
            outcomes = list(zip(answer.positions, answer.outcomes()))
            for position, outcome in outcomes:
                results[position] = outcome
            if any(isinstance(outcome, Overloaded) for _, outcome in outcomes):
                gate.set()  # the refusals are in: let the lane finish the rest
    finally:
        gate.set()
        engine.dispatcher.close()
    refused = [r for r in results if isinstance(r, Overloaded)]
    served = [r for r in results if not isinstance(r, Exception)]
    # One request runs or waits in the queue of one, one more may wait behind a running one.
    assert len(refused) >= 2 and len(refused) + len(served) == 4
    assert all("is overloaded: its queue is full (max_queue_size=1)" in str(r) for r in refused)
    assert {(error_class(r).code, outcome_label(r)) for r in refused} == {("UNAVAILABLE", "overloaded")}
    assert all(r["logits"].shape == (1, 8) for r in served)


def test_a_session_turn_the_scheduler_refuses_frees_its_session_for_the_next_turn(example_engine):
    from latte.backend.sessions import SessionStore

    spec, engine = example_engine("sequence_onnx")
    engine.sessions, engine.session_input = SessionStore(60.0, 4, None), "tokens"
    engine.dispatcher = LaneDispatcher(engine, lanes=1)
    ticks = itertools.count(0.0, 1.0)
    engine.clock = lambda: next(ticks)  # every look at the clock is a second later: a 1 ms timeout passes
    answers = []
    try:
        turn = ParsedRequest(inputs={"tokens": np.array([[5, 6, 7]], np.int64)}, rows=1)
        engine.submit([turn], [RequestOptions(session_id="s", session_start=True, timeout_ms=1)],
                      lambda outcomes, turns: answers.extend(outcomes))
        deadline = time.monotonic() + 30
        while not answers and time.monotonic() < deadline:
            time.sleep(0.01)
        ((_, late),) = answers
        assert isinstance(late, DeadlineExceeded)
        # The start was never run: it opened nothing, and the same start is taken again.
        assert engine.sessions.in_flight() == 0 and engine.sessions.stats().live == 0
        (opened,) = engine.infer([turn], [RequestOptions(session_id="s", session_start=True)])
        assert opened["embedding"].shape[0] == 1 and engine.sessions.stats().live == 1
    finally:
        engine.dispatcher.close()


def test_work_the_scheduler_cannot_queue_is_answered_with_the_rest_of_the_call(example_engine):
    spec, engine = example_engine("mlp_onnx")
    engine.dispatcher = LaneDispatcher(engine, lanes=1)
    submit, calls = engine.dispatcher.scheduler.submit, []

    class Native:  # the native scheduler, refusing its second request
        def __getattr__(self, name):
            return getattr(scheduler, name)

        def submit(self, request_id, key, **kwargs):
            calls.append(request_id)
            if len(calls) == 2:
                raise RuntimeError("the scheduler is closed")
            return submit(request_id, key, **kwargs)

    scheduler = engine.dispatcher.scheduler
    engine.dispatcher.scheduler = Native()
    answers = []
    try:
        feed = EXAMPLES["mlp"].sample(1, np.random.default_rng(0))
        requests = [ParsedRequest(inputs=feed, rows=1) for _ in range(3)]
        engine.submit(requests, [RequestOptions(priority=p) for p in (2, 1, 0)],
                      lambda outcomes, turns: answers.extend(outcomes))
        deadline = time.monotonic() + 30
        while len(answers) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        engine.dispatcher.scheduler = scheduler
        engine.dispatcher.close()
    by_position = dict(answers)
    assert len(answers) == 3 and by_position[0]["logits"].shape == (1, 8)  # queued first: run
    for position in (1, 2):  # the refused one and the one after it, never queued
        assert str(by_position[position]) == ("model 'mlp_onnx' could not queue the request: "
                                              "RuntimeError: the scheduler is closed")
