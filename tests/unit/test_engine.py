"""The batch engine on real exported models, without tritonserver."""

import json

import numpy as np
import pytest
import torch

from latte.backend.config import parse_model_config
from latte.backend.engine import BatchEngine, ModelError
from latte.backend.requests import ParsedRequest, RequestError
from latte.backend.runtimes import RuntimeLoadError, load_runtime
from latte.examples import EXAMPLES, reference_runner
from latte.generator.validate import parse_config_file
from google.protobuf.json_format import MessageToDict


def engine_for(repo, model):
    config = MessageToDict(parse_config_file(repo / model / "config.pbtxt"), preserving_proto_field_name=True)
    spec = parse_model_config(config, repo / model, "1")
    runtime = load_runtime(spec.runtime, spec.model_path, [t.name for t in spec.inputs],
                           [t.name for t in spec.outputs], spec.intra_op_threads, spec.inter_op_threads)
    return spec, BatchEngine(spec, runtime)


@pytest.mark.parametrize("model", ["sequence_onnx", "sequence_torchscript", "cnn_onnx", "mlp_torchscript"])
def test_one_batched_call_matches_each_request_run_alone(example_repo, model):
    info = json.loads((example_repo / "examples.json").read_text())[model]
    example = EXAMPLES[info["example"]]
    spec, engine = engine_for(example_repo, model)
    rng = np.random.default_rng(1)
    feeds = [example.sample(rows, rng) for rows in (1, 3, 2)]
    results = engine.infer([ParsedRequest(inputs=f, rows=next(iter(f.values())).shape[0]) for f in feeds])
    reference = reference_runner(example_repo, model)
    name = example.outputs[0].name
    for feed, result in zip(feeds, results):
        np.testing.assert_allclose(result[name], reference(feed)[name], rtol=1e-5, atol=1e-6)


def test_a_request_that_failed_to_parse_keeps_its_error_and_the_rest_run(example_repo):
    spec, engine = engine_for(example_repo, "mlp_onnx")
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


def test_a_model_exception_fails_only_the_request_that_caused_it(tmp_path):
    model_dir = tmp_path / "picky"
    (model_dir / "1").mkdir(parents=True)
    torch.jit.script(RejectsNegative()).save(str(model_dir / "1" / "model.pt"))
    config = {"name": "picky", "max_batch_size": 8,
              "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2]}],
              "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}]}
    spec = parse_model_config(config, model_dir, "1")
    engine = BatchEngine(spec, load_runtime("torchscript", spec.model_path, ["x"], ["y"], 1, 1))
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


def per_token_engine(tmp_path, **kwargs):
    from latte.backend.buckets import BucketPlan

    model_dir = tmp_path / "per_token"
    (model_dir / "1").mkdir(parents=True)
    torch.jit.script(PerToken()).save(str(model_dir / "1" / "model.pt"))
    config = {"name": "per_token", "max_batch_size": 8,
              "input": [{"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1], "allow_ragged_batch": True}],
              "output": [{"name": "vectors", "data_type": "TYPE_FP32", "dims": [-1, 2]}],
              "parameters": {"max_sequence_length": {"string_value": "64"}}}
    spec = parse_model_config(config, model_dir, "1")
    runtime = load_runtime("torchscript", spec.model_path, ["tokens"], ["vectors"], 1, 1)
    return BatchEngine(spec, runtime, buckets=BucketPlan(spec.bucket_edges), **kwargs)


def test_ragged_inputs_pad_to_their_bucket_and_per_token_outputs_come_back_unpadded(tmp_path):
    records = []
    engine = per_token_engine(tmp_path, on_batch=records.append)
    lengths = (3, 5, 20)  # buckets 16, 16, 32
    requests = [ParsedRequest(inputs={"tokens": np.arange(1, n + 1, dtype=np.int64)[None]}, rows=1) for n in lengths]
    results = engine.infer(requests)
    for n, result in zip(lengths, results):
        assert result["vectors"].shape == (1, n, 2)
        np.testing.assert_array_equal(result["vectors"][0, :, 0], np.arange(1, n + 1))
    assert sorted((r.rows, r.padded_length) for r in records) == [(1, 32), (2, 16)]


def test_a_request_past_its_timeout_fails_without_running(tmp_path):
    from latte.backend.engine import DeadlineExceeded
    from latte.backend.options import RequestOptions

    now = [100.0]
    engine = per_token_engine(tmp_path, clock=lambda: now[0])
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


def test_a_full_arena_fails_the_batch_with_memory_error_and_the_next_request_succeeds(example_repo):
    from latte.memory import BuddyArena

    arena = BuddyArena(256 << 10)  # room for small batches only
    spec, engine = engine_for(example_repo, "cnn_onnx")
    engine.allocate = arena.empty
    rng = np.random.default_rng(3)
    big = [ParsedRequest(inputs=EXAMPLES["cnn"].sample(16, rng), rows=16) for _ in range(2)]
    first, second = engine.infer(big)  # 32 x 3 x 32 x 32 floats = 384 KiB in one buffer
    for outcome in (first, second):
        assert isinstance(outcome, MemoryError) and "bytes" in str(outcome)
    small = [ParsedRequest(inputs=EXAMPLES["cnn"].sample(2, rng), rows=2) for _ in range(2)]
    results = engine.infer(small)
    assert all(r["logits"].shape == (2, 10) for r in results)
    assert arena.stats()["live"] == 0  # every batch buffer went back


def test_results_are_reported_as_each_batch_finishes_in_priority_order(example_repo):
    from latte.backend.options import RequestOptions

    from latte.backend.buckets import BucketPlan

    spec, engine = engine_for(example_repo, "sequence_onnx")
    engine.buckets = BucketPlan(spec.bucket_edges)
    # Three lengths in three shape buckets: three model calls, the last request most urgent.
    requests = [ParsedRequest(inputs={"tokens": np.ones((1, n), np.int64)}, rows=1) for n in (10, 40, 100)]
    heard = []
    results = engine.infer(requests, [RequestOptions(), RequestOptions(), RequestOptions(priority=5)],
                           on_result=lambda position, result: heard.append((position, result)))
    assert [position for position, _ in heard] == [2, 0, 1]
    assert all(result is results[position] for position, result in heard)


def test_a_bad_request_is_reported_before_any_batch_runs(example_repo):
    spec, engine = engine_for(example_repo, "mlp_onnx")
    good = ParsedRequest(inputs=EXAMPLES["mlp"].sample(1, np.random.default_rng(0)), rows=1)
    bad = RequestError("input 'x' is missing")
    heard = []
    engine.infer([good, bad], on_result=lambda position, result: heard.append(position))
    assert heard == [1, 0]
