"""The batch engine on real exported models, without tritonserver."""

import json

import numpy as np
import pytest
import torch

from latte.backend.buckets import BucketPlan
from latte.backend.planner import BatchPlanner
from latte.backend.planning import CostModel
from latte.backend.config import parse_model_config
from latte.backend.engine import BatchEngine
from latte.backend.graph.graph import load_model
from latte.backend.errors import (ConfigError, DeadlineExceeded, ModelError, OutOfMemory, RequestError,
                                  RuntimeLoadError)
from latte.backend.options import RequestOptions
from latte.backend.requests import ParsedRequest, requests_call
from latte.backend.runtimes import load_runtime
from latte.examples import EXAMPLES, reference_runner


@pytest.mark.parametrize("model", ["sequence_onnx", "sequence_torchscript", "cnn_onnx", "mlp_torchscript"])
def test_one_batched_call_matches_each_request_run_alone(example_repo, model, example_engine):
    info = json.loads((example_repo / "examples.json").read_text())[model]
    example = EXAMPLES[info["example"]]
    spec, engine = example_engine(model)
    rng = np.random.default_rng(1)
    feeds = [example.sample(rows, rng) for rows in (1, 3, 2)]
    results = engine.infer([ParsedRequest(inputs=f, rows=next(iter(f.values())).shape[0]) for f in feeds])
    reference = reference_runner(example_repo, model)
    name = example.outputs[0].name
    for feed, result in zip(feeds, results):
        np.testing.assert_allclose(result[name], reference(feed)[name], rtol=1e-5, atol=1e-6)


def test_a_request_that_failed_to_parse_keeps_its_error_and_the_rest_run(example_engine):
    spec, engine = example_engine("mlp_onnx")
    feed = EXAMPLES["mlp"].sample(2, np.random.default_rng(2))
    bad = RequestError("input 'features': expected data type FP32, got FP64")
    results = engine.infer([bad, ParsedRequest(inputs=feed, rows=2)])
    assert results[0] is bad
    assert results[1]["logits"].shape == (2, 8)


class RejectsNegative(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < 0).any()):
            raise ValueError("negative input")
        return x * 2.0


def picky_engine(tmp_path) -> BatchEngine:
    """A TorchScript model that raises on negative inputs, served by the engine."""
    model_dir = tmp_path / "picky"
    (model_dir / "1").mkdir(parents=True)
    torch.jit.script(RejectsNegative()).save(str(model_dir / "1" / "model.pt"))
    config = {"name": "picky", "max_batch_size": 8,
              "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],
              "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}]}
    spec = parse_model_config(config, model_dir, "1")
    graph, _ = load_model(spec)  # a plain model: a graph of one model step
    return BatchEngine(spec, graph)


def test_a_model_exception_fails_only_the_request_that_caused_it(tmp_path):
    engine = picky_engine(tmp_path)
    requests = [ParsedRequest(inputs={"x": np.full((1, 2), v, np.float32)}, rows=1) for v in (1.0, -1.0, 3.0)]
    ok1, failed, ok2 = engine.infer(requests)
    np.testing.assert_array_equal(ok1["y"], [[2.0, 2.0]])
    np.testing.assert_array_equal(ok2["y"], [[6.0, 6.0]])
    assert isinstance(failed, ModelError) and "negative input" in str(failed)


def test_onnx_runtime_refuses_a_config_that_names_tensors_the_graph_lacks(example_repo):
    with pytest.raises(RuntimeLoadError, match="config and ONNX graph disagree"):
        load_runtime("onnx", example_repo / "mlp_onnx" / "1" / "model.onnx", ["wrong"], ["logits"], 1, 1)


class PerToken(torch.nn.Module):
    """Token ids -> one 2-d vector per position (a per-token output of dims [-1, 2])."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.to(torch.float32).unsqueeze(-1)
        return torch.cat([t, t * 10.0], dim=-1)


def per_token_engine(tmp_path, planning="cost", pad_to="edge", cost_model=None, **kwargs):
    model_dir = tmp_path / "per_token"
    (model_dir / "1").mkdir(parents=True)
    torch.jit.script(PerToken()).save(str(model_dir / "1" / "model.pt"))
    config = {"name": "per_token", "max_batch_size": 8,
              "input": [{"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1], "allow_ragged_batch": True}],
              "output": [{"name": "vectors", "data_type": "TYPE_FP32", "dims": [-1, 2]}],
              "parameters": {"max_sequence_length": {"string_value": "64"},
                             "batch_planning": {"string_value": planning},
                             "pad_to": {"string_value": pad_to}}}
    spec = parse_model_config(config, model_dir, "1")
    graph, _ = load_model(spec)
    return BatchEngine(spec, graph, BatchPlanner(spec, cost_model), **kwargs)


class _PricelessModel(CostModel):
    """A cost model that refuses to price anything: a plan that asks it fails."""

    def row_cost(self, edge):
        raise AssertionError("the plan asked for a cost")

    def alone_cost(self, length, rows):
        raise AssertionError("the plan asked for a cost")


def test_a_lone_ragged_request_is_planned_without_pricing_a_plan(tmp_path):
    engine = per_token_engine(tmp_path, cost_model=_PricelessModel(0.0, {16: 1.0, 32: 2.0}))
    assert [list(batch) for batch in engine.planner.plan([1], [40])] == [[0]]
    result, = engine.infer([ParsedRequest(inputs={"tokens": np.arange(1, 41, dtype=np.int64)[None]}, rows=1)])
    assert result["vectors"].shape == (1, 40, 2)
    with pytest.raises(AssertionError, match="asked for a cost"):  # two requests are priced
        engine.planner.plan([1, 1], [3, 40])


@pytest.mark.parametrize("pad_to, shared_batch", [("edge", (2, 16)), ("longest", (2, 5))])
def test_ragged_inputs_pad_to_their_batch_and_per_token_outputs_come_back_unpadded(tmp_path, pad_to, shared_batch):
    engine = per_token_engine(tmp_path, planning="bucket", pad_to=pad_to)
    # Buckets 16, 16, 32: the first two share a batch, padded to their bucket's edge (16) or to
    # the longer of them (5); 20, alone in its bucket, runs at its own length either way.
    lengths = (3, 5, 20)
    requests = [ParsedRequest(inputs={"tokens": np.arange(1, n + 1, dtype=np.int64)[None]}, rows=1) for n in lengths]
    results = engine.infer(requests)
    for n, result in zip(lengths, results):
        assert result["vectors"].shape == (1, n, 2)
        np.testing.assert_array_equal(result["vectors"][0, :, 0], np.arange(1, n + 1))
    assert sorted((r.rows, r.padded_length) for r in engine.runner.take_records()) == [(1, 20), shared_batch]


def test_a_ragged_batch_pads_to_its_longest_member_unless_the_runtime_wants_its_bucket_edge(tmp_path):
    def pad_to(runtime):
        config = {"name": "m", "max_batch_size": 8,
                  "input": [{"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1], "allow_ragged_batch": True}],
                  "output": [{"name": "vectors", "data_type": "TYPE_FP32", "dims": [-1, 2]}],
                  "parameters": {"runtime": {"string_value": runtime}}}
        return parse_model_config(config, tmp_path / "per_token", "1").serving.pad_to

    (tmp_path / "per_token" / "1").mkdir(parents=True)
    (tmp_path / "per_token" / "1" / "model.onnx").write_bytes(b"")
    assert pad_to("onnx") == "longest"
    assert pad_to("tensorrt") == "edge"


def test_a_request_past_its_timeout_fails_without_running(tmp_path):
    now = [100.0]
    # Bucket planning keeps the urgent short request apart from the long ones.
    engine = per_token_engine(tmp_path, planning="bucket", clock=lambda: now[0])
    request = ParsedRequest(inputs={"tokens": np.ones((1, 4), np.int64)}, rows=1)
    original_run = engine._run

    def slow_run(group):  # the first batch takes 50 ms of (virtual) time
        now[0] += 0.05
        return original_run(group)

    engine._run = slow_run
    urgent = RequestOptions(priority=1)
    patient, hurried = RequestOptions(timeout_ms=1000), RequestOptions(timeout_ms=10)
    long_request = ParsedRequest(inputs={"tokens": np.ones((1, 40), np.int64)}, rows=1)
    ok_first, ok_late, timed_out = engine.infer([request, long_request, long_request],
                                                [urgent, patient, hurried])
    assert ok_first["vectors"].shape == (1, 4, 2)
    assert ok_late["vectors"].shape == (1, 40, 2)
    assert isinstance(timed_out, DeadlineExceeded) and "timeout_ms=10" in str(timed_out)


def test_a_full_arena_fails_the_batch_with_memory_error_and_the_next_request_succeeds(example_engine):
    from latte.memory import BuddyArena

    from latte.backend import memory_resource

    arena = BuddyArena(256 << 10)  # room for small batches only
    spec, engine = example_engine("cnn_onnx")
    memory_resource.use(arena.empty)
    try:
        rng = np.random.default_rng(3)
        big = [ParsedRequest(inputs=EXAMPLES["cnn"].sample(16, rng), rows=16) for _ in range(2)]
        first, second = engine.infer(big)  # 32 x 3 x 32 x 32 floats = 384 KiB in one buffer
        for outcome in (first, second):
            assert isinstance(outcome, OutOfMemory) and "bytes" in str(outcome)
        small = [ParsedRequest(inputs=EXAMPLES["cnn"].sample(2, rng), rows=2) for _ in range(2)]
        results = engine.infer(small)
    finally:
        memory_resource.release(arena.empty)
    assert all(r["logits"].shape == (2, 10) for r in results)
    assert arena.stats()["live"] == 0  # every batch buffer went back


def test_a_device_out_of_memory_is_answered_as_out_of_memory_and_the_next_batch_runs(example_engine):
    """latte's device arena refuses through torch with a RuntimeError, not a MemoryError; the
    request is answered as the host arena's refusal is (UNAVAILABLE: retry), not as a model error."""
    spec, engine = example_engine("cnn_onnx")
    runtime = engine.runner.graph.steps[0].runtime
    original_run = runtime.run
    refusals = iter([RuntimeError("CUDA out of memory: latte device arena on device 0: BuddyArena: cannot "
                                  "allocate 25165824 bytes: no free run holds it")])

    def run_refused_once(*args, **kwargs):
        for refusal in refusals:
            raise refusal
        return original_run(*args, **kwargs)

    runtime.run = run_refused_once
    rng = np.random.default_rng(5)
    refused, = engine.infer([ParsedRequest(inputs=EXAMPLES["cnn"].sample(2, rng), rows=2)])
    served, = engine.infer([ParsedRequest(inputs=EXAMPLES["cnn"].sample(2, rng), rows=2)])
    assert isinstance(refused, OutOfMemory) and "cannot allocate 25165824 bytes" in str(refused)
    assert served["logits"].shape == (2, 10)


def test_each_result_is_handed_over_as_its_batch_finishes_high_priority_first(example_engine):
    """What lets the backend answer a request before later batches of the same call run."""
    # One batch per bucket, so the call runs two batches.
    spec, engine = example_engine("sequence_onnx", bucketed=True, batch_planning="bucket")
    batches_run = engine.runner.records  # what each batch run did, as the engine records it
    rng = np.random.default_rng(4)
    short = [ParsedRequest(inputs=EXAMPLES["sequence"].sample(1, rng, length=n), rows=1) for n in (5, 6, 7)]
    long = ParsedRequest(inputs=EXAMPLES["sequence"].sample(1, rng, length=120), rows=1)
    unreadable = RequestError("input 'tokens': expected data type INT64, got FP32")
    items = [short[0], unreadable, short[1], long, short[2]]
    options = [RequestOptions(), None, RequestOptions(), RequestOptions(priority=2), RequestOptions()]
    delivered = []
    groups = []
    for answer in engine.answers(requests_call(items, options)):
        outcomes = list(zip(answer.positions, answer.outcomes()))
        groups.append([pos for pos, _ in outcomes])
        delivered.extend((pos, len(batches_run), out) for pos, out in outcomes)
    assert sorted(pos for pos, _, _ in delivered) == [0, 1, 2, 3, 4]            # each exactly once
    assert delivered[0][0] == 1 and delivered[0][1] == 0                         # the bad one before any batch ran
    batch_of = {pos: batches for pos, batches, _ in delivered}
    assert all(batch_of[3] <= batch_of[p] for p in (0, 2, 4))                    # high priority not after the rest
    assert all(batch_of[p] >= 1 for p in (0, 2, 3, 4))                           # results come after their batch
    assert delivered[0][2] is unreadable and all(isinstance(out, dict) for _, _, out in delivered[1:])
    assert len(batches_run) == 2                                                 # two buckets, two calls
    assert groups == [[1], [3], [0, 2, 4]]                                       # refused, then batch by batch


def test_cost_planning_lets_short_requests_ride_in_a_longer_bucket_and_unpads_them(tmp_path):
    from latte.backend.planning import CostModel

    engine = per_token_engine(tmp_path, cost_model=CostModel(1e-3, {16: 1e-6, 32: 2e-6, 64: 4e-6}))
    lengths = (3, 5, 20, 40)  # buckets 16, 16, 32, 64: one call instead of three
    requests = [ParsedRequest(inputs={"tokens": np.arange(1, n + 1, dtype=np.int64)[None]}, rows=1) for n in lengths]
    results = engine.infer(requests)
    for n, result in zip(lengths, results):
        assert result["vectors"].shape == (1, n, 2)
        np.testing.assert_array_equal(result["vectors"][0, :, 1], np.arange(1, n + 1) * 10.0)
    assert [(r.rows, r.padded_length) for r in engine.runner.take_records()] == [(4, 64)]


@pytest.mark.parametrize("model", ["sequence_onnx", "sequence_torchscript"])
def test_cost_planned_batches_give_each_request_exactly_its_output_alone(example_repo, model, example_engine):
    from latte.backend.planning import CostModel

    spec, engine = example_engine(model, bucketed=True)
    # A model call costs as much as 2000 padded positions: every call's requests share one batch.
    engine.planner.cost_model = CostModel(2000.0, {e: float(e) for e in spec.serving.bucket_edges})
    rng = np.random.default_rng(5)
    feeds = [EXAMPLES["sequence"].sample(1, rng, length=n) for n in (3, 17, 40, 90, 128, 1, 64, 33)]
    results = engine.infer([ParsedRequest(inputs=f, rows=1) for f in feeds])
    assert [(r.rows, r.padded_length) for r in engine.runner.take_records()] == [(8, 128)]
    alone = [engine.infer([ParsedRequest(inputs=f, rows=1)])[0] for f in feeds]
    reference = reference_runner(example_repo, model)
    for feed, together, single in zip(feeds, results, alone):
        # Padding is masked: the shared batch gives each request its own answer. A request
        # alone runs at its own length, another shape, so float32 rounding may differ in the
        # last bit.
        np.testing.assert_allclose(together["embedding"], single["embedding"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(together["embedding"], reference(feed)["embedding"], rtol=1e-5, atol=1e-6)


def test_the_warmup_timings_give_a_cost_model_for_every_bucket(example_engine):
    from latte.backend.warmup import measure_cost_model

    spec, engine = example_engine("sequence_onnx", bucketed=True)
    model = measure_cost_model(engine, repeats=3, rows=4)
    assert sorted(model.per_row_s) == list(spec.serving.bucket_edges)
    costs = [model.per_row_s[e] for e in spec.serving.bucket_edges]
    assert costs == sorted(costs) and costs[-1] > 0 and model.fixed_s >= 0
    # Lone requests shorter than the first edge run at their own length, and are timed so.
    first = spec.serving.bucket_edges[0]
    assert set(model.single_s) == set(spec.serving.bucket_edges) | {first // 2, first // 4, first // 8, first // 16} - {0}
    assert engine.runner.take_records() == [] and engine.runner.recording  # timing calls are not counted as traffic


def test_batch_planning_is_a_checked_config_parameter(example_engine):
    spec, engine = example_engine("sequence_onnx", bucketed=True)
    assert spec.serving.batch_planning == "cost" and engine.planner.cost_model is not None
    spec, engine = example_engine("sequence_onnx", bucketed=True, batch_planning="bucket")
    assert engine.planner.cost_model is None
    with pytest.raises(ConfigError, match="batch_planning must be one of cost, bucket, got 'greedy'"):
        example_engine("sequence_onnx", batch_planning="greedy")


def test_requests_planned_into_one_batch_share_the_affinity_key_of_its_edge(tmp_path):
    from latte.backend.engine import Work
    from latte.backend.planning import CostModel

    engine = per_token_engine(tmp_path, cost_model=CostModel(1e-3, {16: 1e-6, 32: 2e-6, 64: 4e-6}))
    work = [Work(i, ParsedRequest(inputs={"tokens": np.ones((1, n), np.int64)}, rows=1)) for i, n in enumerate((3, 20))]
    keys = engine.planned_keys(work)
    assert keys[0] == keys[1] and keys[0][-1] == ("bucket", 32)
    engine.planner.cost_model = None  # bucket planning: each request keeps its own bucket
    keys = engine.planned_keys(work)
    assert keys[0][-1] == ("bucket", 16) and keys[1][-1] == ("bucket", 32)


def test_cost_planned_batches_still_run_highest_priority_first(tmp_path):
    from latte.backend.options import RequestOptions
    from latte.backend.planning import CostModel

    # Rows dominate: short and long requests are cheaper apart.
    engine = per_token_engine(tmp_path, cost_model=CostModel(1e-9, {16: 1e-3, 32: 2e-3, 64: 4e-3}))
    short, long = (ParsedRequest(inputs={"tokens": np.ones((1, n), np.int64)}, rows=1) for n in (3, 40))
    engine.infer([short, short, long], [RequestOptions(), RequestOptions(), RequestOptions(priority=2)])
    # Each alone at its own length (cheaper than padding), the high-priority one first.
    assert [(r.rows, r.padded_length) for r in engine.runner.take_records()] == [(1, 40), (1, 3), (1, 3)]


def test_models_loading_side_by_side_time_themselves_one_at_a_time():
    import subprocess
    import sys
    import time

    from latte.backend.warmup import exclusive_timing

    waiter = ("import time; from latte.backend.warmup import exclusive_timing\n"
              "print('ready', flush=True); started = time.monotonic()\n"
              "with exclusive_timing(): print(time.monotonic() - started)")
    with exclusive_timing():
        other = subprocess.Popen([sys.executable, "-c", waiter], stdout=subprocess.PIPE, text=True)
        assert other.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # the other process (a second model's stub) waits meanwhile
    waited = float(other.communicate(timeout=60)[0])
    assert waited > 0.5


def test_a_call_whose_every_request_was_refused_runs_no_model(example_engine):
    spec, engine = example_engine("mlp_onnx")
    refusals = [RequestError("bad one"), RequestError("bad two")]
    assert engine.infer(refusals) == refusals


def test_a_torchscript_failure_reaches_the_client_as_one_line_and_the_log_keeps_the_rest(tmp_path):
    engine = picky_engine(tmp_path)
    (failed,) = engine.infer([ParsedRequest(inputs={"x": np.full((1, 2), -1.0, np.float32)}, rows=1)])
    assert isinstance(failed, ModelError)
    assert "\n" not in str(failed) and str(failed).endswith("negative input")
    assert "TorchScript" in failed.detail and "negative input" in failed.detail


def test_a_session_request_that_cannot_continue_is_refused_alone_and_the_call_goes_on(tmp_path):
    from latte.backend.sessions import SessionStore

    store = SessionStore(60.0, 8, 64)
    engine = per_token_engine(tmp_path, sessions=store, session_input="tokens")
    real_extend = store.extend

    def extend(session_id, tokens, start, end=False):
        if session_id == "full":
            raise MemoryError("the arena has 0 of 4096 bytes free")
        return real_extend(session_id, tokens, start, end)

    store.extend = extend
    tokens = {"tokens": np.array([[1, 2]], dtype=np.int64)}
    items = [ParsedRequest(inputs={}, rows=1), ParsedRequest(inputs=tokens, rows=1),
             ParsedRequest(inputs=tokens, rows=1)]
    options = [RequestOptions(session_id="bare", session_start=True),
               RequestOptions(session_id="full", session_start=True),
               RequestOptions(session_id="fine", session_start=True)]
    bare, full, fine = engine.infer(items, options)
    assert type(bare) is RequestError
    assert str(bare) == "a session request carries the session's tokens in input 'tokens', which this request does not"
    assert type(full) is OutOfMemory and str(full) == "the arena has 0 of 4096 bytes free"
    np.testing.assert_array_equal(fine["vectors"], [[[1.0, 10.0], [2.0, 20.0]]])


def test_a_sessions_turns_in_one_call_are_one_at_a_time_and_a_failed_turn_frees_its_session(tmp_path):
    from latte.backend.sessions import SessionStore

    store = SessionStore(60.0, 2, 64)
    engine = per_token_engine(tmp_path, sessions=store, session_input="tokens")

    def turn(*values):
        return ParsedRequest(inputs={"tokens": np.array([values], dtype=np.int64)}, rows=1)

    # Two starts of one session, and a third session past max_sessions=2 with one start in flight.
    opened, again, third, other = engine.infer(
        [turn(1), turn(2), turn(3), turn(4)],
        [RequestOptions(session_id="s", session_start=True), RequestOptions(session_id="s", session_start=True),
         RequestOptions(session_id="t", session_start=True), RequestOptions(session_id="u", session_start=True)])
    assert "vectors" in opened and "vectors" in third
    assert type(again) is RequestError
    assert str(again) == "session 's' has a request in flight; send its next request after that one's answer"
    assert type(other) is RequestError and str(other).startswith("too many open sessions (2)")
    assert (store.stats().live, store.in_flight()) == (2, 0)

    # A turn whose deadline passed before it ran is answered, and the session takes its next turn
    # on the prefix it had.
    late = iter([100.0])  # admitted at 100 s, run at 100.5 s: past its 1 ms
    engine.clock = lambda: next(late, 100.5)
    (timed_out,) = engine.infer([turn(5)], [RequestOptions(session_id="s", timeout_ms=1.0)])
    assert type(timed_out) is DeadlineExceeded
    assert store.in_flight() == 0
    (next_turn,) = engine.infer([turn(6)], [RequestOptions(session_id="s")])
    np.testing.assert_array_equal(next_turn["vectors"][0, :, 0], [1.0, 6.0])


def test_a_call_given_up_after_its_refusals_leaves_no_session_turn_in_flight(tmp_path):
    from latte.backend.sessions import SessionStore

    store = SessionStore(60.0, 2, 64)
    engine = per_token_engine(tmp_path, sessions=store, session_input="tokens")
    turn = ParsedRequest(inputs={"tokens": np.array([[1, 2]], dtype=np.int64)}, rows=1)
    answers = engine.answers(requests_call([RequestError("a bad one"), turn],
                                           [None, RequestOptions(session_id="s", session_start=True)]))
    next(answers)  # the refusal; then the caller fails answering it and drops the rest of the call
    answers.close()
    assert store.in_flight() == 0
    (opened,) = engine.infer([turn], [RequestOptions(session_id="s", session_start=True)])
    assert "vectors" in opened and store.stats().live == 1


def test_the_requests_of_a_failed_batch_run_alone_after_its_buffers_went_back(tmp_path):
    from latte.backend import memory_resource
    from latte.memory import BuddyArena

    arena = BuddyArena(1 << 20)
    engine = picky_engine(tmp_path)
    live_at_retries = []
    run_alone = engine.run_batch

    def retry(requests):
        live_at_retries.append((len(requests), arena.stats()["live"]))
        return run_alone(requests)

    engine.run_batch = retry
    memory_resource.use(arena.empty)
    try:
        requests = [ParsedRequest(inputs={"x": np.full((1, 2), v, np.float32)}, rows=1) for v in (1.0, -1.0, 3.0)]
        ok1, failed, ok2 = engine.infer(requests)
    finally:
        memory_resource.release(arena.empty)
    assert isinstance(failed, ModelError) and ok1["y"].tolist() == [[2.0, 2.0]] and ok2["y"].tolist() == [[6.0, 6.0]]
    # The batch of three failed on -1; each then ran alone, with nothing of the batch held.
    assert live_at_retries == [(3, 0), (1, 0), (1, 0), (1, 0)]
