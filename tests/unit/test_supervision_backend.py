"""A LatteModel given a state folder (LATTE_STATE_DIR), as `latte serve` runs it: each call it
runs is marked in its flight file until answered, inputs that crashed it twice are refused
alone, and its sessions outlive its process. Given none, it writes nothing."""

import json
import os
import time

import numpy as np
import pytest

from example_models import example_config
from latte.backend.sessions import SessionStore
from latte.backend.standin_stub import InferenceRequest, StandinStub, TritonError
from latte.backend.triton_model import LatteModel
from latte.examples import EXAMPLES
from latte.supervision.checkpoint import SessionCheckpoint
from latte.supervision.flight import read_flights
from latte.supervision.poison import PoisonList, input_digest, refusal_message
from latte.supervision.state import STATE_DIR_ENV, flight_path, poison_path, sessions_dir


def start(repo, model, instance=None, **parameters):
    """The model as Triton initialises one instance of it, in this process."""
    args = {"model_config": json.dumps(example_config(repo, model, **parameters)),
            "model_repository": str(repo / model), "model_version": "1",
            "model_instance_name": instance or f"{model}_0"}
    return LatteModel(args, StandinStub)


def features(seed, rows=1):
    return EXAMPLES["mlp"].sample(rows, np.random.default_rng(seed))


def digest(feed):
    return input_digest(list(feed.items()))


def answered(requests, responses, deadline_s=10.0):
    """Each request's response: returned by execute, or sent (async_execute; waited for)."""
    if responses is not None:
        return responses
    deadline = time.monotonic() + deadline_s
    while not all(r._sender is not None and r._sender.sent for r in requests) and time.monotonic() < deadline:
        time.sleep(0.005)
    return [r._sender.sent[0][0] if r._sender is not None and r._sender.sent else None for r in requests]


def wait_landed(path, deadline_s=10.0):
    """What the flight file says is in flight once it says nothing is (or the deadline passed)."""
    deadline = time.monotonic() + deadline_s
    while read_flights(path) and time.monotonic() < deadline:
        time.sleep(0.005)
    return read_flights(path)


def watch_flights(model, path):
    """Each batch the model runs sees the flight file as the supervisor would read it then."""
    seen = []
    run = model.engine.runner.run

    def run_watched(batch, started=None):
        seen.append(read_flights(path))
        return run(batch, started)

    model.engine.runner.run = run_watched
    return seen


WAYS = {
    "plain": ({}, None),
    "options": ({}, {"priority_level": 1}),
    "lanes": ({"scheduler": "affinity"}, None),
    "async": ({"async_execute": "true"}, {"priority_level": 1}),
}


@pytest.mark.parametrize("way", list(WAYS))
def test_a_call_is_in_flight_while_it_runs_and_not_once_answered(example_repo, tmp_path, monkeypatch, way):
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    parameters, options = WAYS[way]
    model = start(example_repo, "mlp_onnx", **parameters)
    path = flight_path(tmp_path, "mlp_onnx", "mlp_onnx_0", os.getpid())
    try:
        assert path.exists() and read_flights(path) == []
        seen = watch_flights(model, path)
        feeds = [features(1), features(2, rows=2), features(3)]
        requests = [InferenceRequest(f, parameters=json.dumps(options) if options and i == 0 else "{}")
                    for i, f in enumerate(feeds)]

        responses = answered(requests, model.execute(requests))

        assert all(r is not None and not r.has_error() for r in responses)
        assert seen, "the model ran no batch"
        for flights in seen:  # the call was marked before its first batch ran
            assert len(flights) == 1
            assert sorted(flights[0].digests) == sorted(digest(f) for f in feeds)
        assert wait_landed(path) == []
    finally:
        model.finalize()
    assert not path.exists()


@pytest.mark.parametrize("way", ["plain", "options", "async"])
def test_an_input_that_crashed_the_model_twice_is_refused_alone(example_repo, tmp_path, monkeypatch, way):
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    poison, good = features(7), features(8)
    poisons = PoisonList(poison_path(tmp_path, "mlp_onnx"))
    poisons.record_crash([[digest(poison), digest(good)]])  # both in flight at the first crash
    poisons.record_crash([[digest(poison)]])                # the poison alone at the second
    parameters, options = WAYS[way]
    model = start(example_repo, "mlp_onnx", **parameters)
    path = flight_path(tmp_path, "mlp_onnx", "mlp_onnx_0", os.getpid())
    try:
        seen = watch_flights(model, path)
        requests = [InferenceRequest(poison),
                    InferenceRequest(good, parameters=json.dumps(options) if options else "{}")]

        refused, fine = answered(requests, model.execute(requests))

        assert refused.has_error() and refused.error().code() == TritonError.INVALID_ARG
        assert refused.error().message() == refusal_message("mlp_onnx")
        assert refused.error().message().startswith("model 'mlp_onnx' refused this input: it crashed the model twice")
        assert not fine.has_error()
        reference = start(example_repo, "mlp_onnx", instance="reference")  # refuses nothing: it reads no crash
        try:
            (want,) = reference.execute([InferenceRequest(good)])
        finally:
            reference.finalize()
        np.testing.assert_allclose(fine.output_tensors()[0].as_numpy(), want.output_tensors()[0].as_numpy(),
                                   rtol=1e-6, atol=1e-7)
        assert [[f.digests for f in flights] for flights in seen] == [[[digest(good)]]]  # the refused never ran
        assert wait_landed(path) == []
    finally:
        model.finalize()


def tokens(*values):
    return {"tokens": np.array([values], np.int64)}


def turn(model, values, **session):
    (response,) = model.execute([InferenceRequest(tokens(*values), parameters=json.dumps(session))])
    assert not response.has_error(), response.error().message()
    return response.output_tensors()[0].as_numpy()


def test_a_session_continues_after_its_process_was_killed_between_turns(example_repo, tmp_path, monkeypatch):
    monkeypatch.delenv(STATE_DIR_ENV, raising=False)
    never_restarted = start(example_repo, "sequence_onnx")
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    first = start(example_repo, "sequence_onnx", instance="sequence_onnx_0")
    restarted = None
    try:
        for model in (never_restarted, first):
            turn(model, (5, 9, 2), session_id="chat", session_start=True)
            turn(model, (40, 41), session_id="chat")
        assert sorted(SessionCheckpoint(sessions_dir(tmp_path, "sequence_onnx")).load()) == ["chat"]
        # The first process dies here, without finalize; Triton starts the instance again.
        restarted = start(example_repo, "sequence_onnx", instance="sequence_onnx_1")
        assert restarted.sessions.stats().live == 1

        want = turn(never_restarted, (7, 7, 8, 1), session_id="chat")
        got = turn(restarted, (7, 7, 8, 1), session_id="chat")

        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        kept = SessionCheckpoint(sessions_dir(tmp_path, "sequence_onnx")).load()
        np.testing.assert_array_equal(kept["chat"], [5, 9, 2, 40, 41, 7, 7, 8, 1])
        turn(restarted, (3,), session_id="chat", session_end=True)
        assert SessionCheckpoint(sessions_dir(tmp_path, "sequence_onnx")).load() == {}
    finally:
        for model in (never_restarted, first, restarted):
            if model is not None:
                model.finalize()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_an_expired_session_leaves_the_checkpoint_and_restored_ones_are_fresh(tmp_path):
    kept, clock = SessionCheckpoint(tmp_path), Clock()
    store = SessionStore(ttl_s=5, max_sessions=4, max_length=None, clock=clock, checkpoint=kept)
    for session in ("a", "b"):
        store.commit(store.extend(session, np.array([[1, 2]], np.int64), start=True))
    clock.now = 3.0
    store.commit(store.extend("b", np.array([[3]], np.int64), start=False))
    clock.now = 6.0
    assert store.reap() == 1  # "a", idle past the TTL
    assert sorted(kept.load()) == ["b"]

    clock.now = 100.0
    again = SessionStore(ttl_s=5, max_sessions=4, max_length=None, clock=clock, checkpoint=kept)
    assert again.restore(kept.load()) == 1
    assert again.reap() == 0  # restored as just used, however old its file
    next_turn = again.extend("b", np.array([[4]], np.int64), start=False)
    np.testing.assert_array_equal(next_turn.sequence, [[1, 2, 3, 4]])


def test_restored_sessions_past_the_limit_are_dropped(tmp_path):
    kept = SessionCheckpoint(tmp_path)
    for session in ("a", "b", "c"):
        kept.save(session, np.array([1], np.int64))
    store = SessionStore(ttl_s=5, max_sessions=2, max_length=None, checkpoint=kept)
    assert store.restore(kept.load()) == 2
    assert store.stats().live == 2 and len(kept.load()) == 2


def test_without_a_state_folder_nothing_is_written(example_repo, tmp_path, monkeypatch):
    from latte.backend import vitals

    def no_state(*_, **__):
        raise AssertionError("a model given no state folder keeps no state")

    for name in ("FlightRecorder", "PoisonList", "SessionCheckpoint"):
        monkeypatch.setattr(vitals, name, no_state)
    monkeypatch.delenv(STATE_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    model = start(example_repo, "sequence_onnx")
    try:
        assert model.vitals is None and model.sessions.checkpoint is None
        turn(model, (5, 9), session_id="chat", session_start=True)
        turn(model, (4,), session_id="chat")
        (plain,) = model.execute([InferenceRequest(tokens(1, 2, 3))])
        assert not plain.has_error()
    finally:
        model.finalize()
    assert list(tmp_path.iterdir()) == []


def test_inputs_seen_at_a_crash_run_alone_after_the_others_until_one_run_clears_them(example_repo, tmp_path,
                                                                                      monkeypatch):
    """A crash blames every input batched with its culprit; run alone next, the culprit is the
    only one in flight if it crashes the model again, and an innocent one is cleared."""
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    a, b, c = features(11), features(12), features(13)
    PoisonList(poison_path(tmp_path, "mlp_onnx")).record_crash([[digest(a), digest(b)]])
    model = start(example_repo, "mlp_onnx")
    path = flight_path(tmp_path, "mlp_onnx", "mlp_onnx_0", os.getpid())
    reference = start(example_repo, "mlp_onnx", instance="reference")
    try:
        seen = watch_flights(model, path)
        responses = model.execute([InferenceRequest(a), InferenceRequest(b), InferenceRequest(c)])

        assert [[f.digests for f in flights] for flights in seen] == [[[digest(c)]], [[digest(a)]], [[digest(b)]]]
        wants = reference.execute([InferenceRequest(a), InferenceRequest(b), InferenceRequest(c)])
        for got, want in zip(responses, wants):  # in the call's order, whatever order they ran in
            assert not got.has_error()
            np.testing.assert_allclose(got.output_tensors()[0].as_numpy(), want.output_tensors()[0].as_numpy(),
                                       rtol=1e-6, atol=1e-7)
        seen.clear()
        model.execute([InferenceRequest(a), InferenceRequest(b)])  # both ran alone without a crash: cleared
        assert [[sorted(f.digests) for f in flights] for flights in seen] == [[sorted([digest(a), digest(b)])]]
    finally:
        model.finalize()
        reference.finalize()
