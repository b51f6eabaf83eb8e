"""A fused model's execute as Triton calls it, on stand-ins for the stub's objects: each example
pipeline answers as its steps answer run one after another, every request once; a step that
fails fails only the requests it fails on, with the step named; a step whose tensors do not
match what its readers declare is refused at load."""

import json
import shutil

import numpy as np
import pytest

from example_models import example_model
from latte.backend.errors import ConfigError
from latte.backend.standin_stub import InferenceRequest, TritonError
from latte.examples.pipeline import PIPELINES, InProcess


def outputs_of(response):
    assert not response.has_error(), response.error().message()
    return {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}


def copy_of(fused_pipelines, name, tmp_path):
    _, repo = fused_pipelines[name]
    target = tmp_path / "repo"
    shutil.copytree(repo, target)
    return target


@pytest.mark.parametrize("name", ["text", "image", "branching"])
def test_each_example_pipeline_answers_as_its_steps_do_in_process(fused_pipelines, name):
    files, repo = fused_pipelines[name]
    example = PIPELINES[name]
    model = example_model(repo, example.ensemble)
    reference = InProcess(files, name)
    requests = example.requests(12, seed=3)

    responses = model.execute([InferenceRequest(r) for r in requests])

    assert len(responses) == len(requests)
    for request, response in zip(requests, responses):
        got, want = outputs_of(response), reference(request)
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6)
    model.finalize()


def test_a_request_alone_is_answered_bit_for_bit_as_its_steps_answer_it(fused_pipelines):
    files, repo = fused_pipelines["text"]
    model = example_model(repo, "embed_text")
    reference = InProcess(files, "text")
    for request in PIPELINES["text"].requests(5, seed=11):
        (response,) = model.execute([InferenceRequest(request)])
        got, want = outputs_of(response), reference(request)
        for key in want:
            assert np.array_equal(got[key], want[key])
    model.finalize()


def test_each_step_is_timed_and_counted_and_the_arena_gets_its_memory_back(fused_pipelines):
    _, repo = fused_pipelines["branching"]
    model = example_model(repo, "embed_and_tag")
    live = model.arena.stats()["live"]
    requests = PIPELINES["branching"].requests(9, seed=5)

    model.execute([InferenceRequest(r) for r in requests])
    model._refresh_gauges()

    counters, _ = model.metrics.aggregate.snapshot()
    for step in ("tokenize", "encoder", "normalize", "topics"):
        assert counters[("latte_step_rows_total", (("step", step),))] >= 9
        assert counters[("latte_step_us_total", (("step", step),))] > 0
    assert model.arena.stats()["live"] == live  # every intermediate dropped once its readers ran
    model.finalize()


FAILING_TOKENIZE = '''

_tokenize = tokenize


def tokenize(texts):
    if any(b"boom" in t for t in texts.reshape(-1)):
        raise RuntimeError("cannot tokenize a boom")
    if any(b"forbidden" in t for t in texts.reshape(-1)):
        raise ValueError("forbidden words are refused")
    return _tokenize(texts)
'''


def test_a_failing_step_fails_only_the_requests_it_fails_on_with_the_step_named(fused_pipelines, tmp_path):
    repo = copy_of(fused_pipelines, "text", tmp_path)
    with open(repo / "embed_text" / "1" / "steps" / "tokenize" / "1" / "model.py", "a") as step:
        step.write(FAILING_TOKENIZE)
    model = example_model(repo, "embed_text")
    texts = [b"a good text", b"this goes boom", b"another good one", b"a forbidden text"]
    requests = [InferenceRequest({"TEXT": np.array([[t]], dtype=object)}) for t in texts]

    good, boom, other, forbidden = model.execute(requests)

    assert outputs_of(good)["EMBEDDING"].shape == (1, 32) and outputs_of(other)["NORM"].shape == (1, 1)
    assert boom.error().code() == TritonError.INTERNAL
    assert boom.error().message() == ("model 'embed_text': step 'tokenize' failed: RuntimeError: cannot tokenize "
                                      "a boom")
    assert forbidden.error().code() == TritonError.INVALID_ARG
    assert forbidden.error().message() == "step 'tokenize': forbidden words are refused"
    (after,) = model.execute([InferenceRequest({"TEXT": np.array([[b"still serving"]], dtype=object)})])
    assert outputs_of(after)["EMBEDDING"].shape == (1, 32)
    model.finalize()


def test_a_step_input_declared_unlike_what_feeds_it_is_refused_at_load(fused_pipelines, tmp_path):
    repo = copy_of(fused_pipelines, "text", tmp_path)
    path = repo / "embed_text" / "1" / "graph.json"
    graph = json.loads(path.read_text())
    encoder = next(step for step in graph["steps"] if step["name"] == "encoder")
    encoder["config"]["input"][0]["data_type"] = "TYPE_INT32"
    path.write_text(json.dumps(graph))

    with pytest.raises(ConfigError) as refused:
        example_model(repo, "embed_text")
    # The sample batch at load: the pipeline's 16 sample texts, padded to the longest.
    from latte.backend.samples import decode_sample

    longest = max(len(decode_sample(sample["TEXT"], np.dtype(object)).reshape(-1)[0].split())
                  for sample in graph["samples"])
    assert str(refused.value) == (f"graph.json: step 'tokenize' output 'TOKENS' is INT64 [16, {longest}], but step "
                                  "'encoder' reads it as input 'tokens' declared INT32 [-1, -1]")


WIDENING_NORMALIZE = '''

_normalize = normalize


def normalize(embedding):
    unit, norms = _normalize(embedding)
    return unit.astype(np.float64), norms
'''


def test_a_step_whose_output_is_not_what_it_declares_is_refused_at_load(fused_pipelines, tmp_path):
    repo = copy_of(fused_pipelines, "text", tmp_path)
    with open(repo / "embed_text" / "1" / "steps" / "normalize" / "1" / "model.py", "a") as step:
        step.write(WIDENING_NORMALIZE)
    with pytest.raises(ConfigError, match=r"^graph.json: step 'normalize' output 'EMBEDDING' comes out FP64 \[16, 32\]; "
                                          r"the step declares FP32 \[-1, 32\]$"):
        example_model(repo, "embed_text")  # the file's name alone: checked on a served batch, it reaches clients


def test_a_ragged_output_comes_back_at_each_requests_own_length(tmp_path):
    """A graph of one step whose output is ragged: token ids, one row per text."""
    from latte.examples.pipeline import STEPS

    model_dir = tmp_path / "repo" / "tokens"
    step = model_dir / "1" / "steps" / "tokenize" / "1"
    step.mkdir(parents=True)
    shutil.copy(STEPS / "tokenize.py", step / "model.py")
    text = {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}
    tokens = {"name": "TOKENS", "data_type": "TYPE_INT64", "dims": [-1]}
    (model_dir / "1" / "graph.json").write_text(json.dumps({
        "format": "latte-graph/1", "inputs": [text], "outputs": [tokens],
        "steps": [{"name": "tokenize", "folder": "steps/tokenize", "function": "tokenize",
                   "inputs": {"TEXT": "TEXT"}, "outputs": {"TOKENS": "TOKENS"},
                   "config": {"name": "tokenize", "backend": "python", "max_batch_size": 8,
                              "input": [text], "output": [tokens]}}]}))
    (model_dir / "config.pbtxt").write_text('''name: "tokens"
backend: "latte"
max_batch_size: 8
input { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }
output { name: "TOKENS" data_type: TYPE_INT64 dims: [ -1 ] }
parameters { key: "model_file" value: { string_value: "graph.json" } }
''')
    model = example_model(tmp_path / "repo", "tokens")
    texts = [b"one", b"one two three four", b"one two"]

    responses = model.execute([InferenceRequest({"TEXT": np.array([[t]], dtype=object)}) for t in texts])

    lengths = [outputs_of(r)["TOKENS"].shape for r in responses]
    assert lengths == [(1, 1), (1, 4), (1, 2)]
    model.finalize()


def test_an_existing_triton_python_model_runs_unchanged_inside_the_fused_model(tmp_path):
    from latte.examples.pipeline import write_hand_written_repository
    from latte.generator.fuse import fuse_repository

    repo = write_hand_written_repository(tmp_path / "repo", "onnxruntime")
    fuse_repository(repo, "embed_text", tmp_path / "fused")
    model = example_model(tmp_path / "fused", "embed_text")
    assert "tokenize (python_model) -> encoder (model) -> normalize (python_model)" in model.graph.describe()
    build = tmp_path / "build"
    (build / "sequence").mkdir(parents=True)
    shutil.copy(repo / "encoder" / "1" / "model.onnx", build / "sequence" / "model.onnx")
    texts = [b"the quick brown fox", b"jumps", b"over the lazy dog again and again"]
    responses = model.execute([InferenceRequest({"TEXT": np.array([[t]], dtype=object)}) for t in texts])
    reference = InProcess(build, "text")
    for text, response in zip(texts, responses):
        want = reference({"TEXT": np.array([[text]], dtype=object)})
        np.testing.assert_allclose(outputs_of(response)["EMBEDDING"], want["EMBEDDING"], rtol=1e-5, atol=1e-6)
    model.finalize()


def test_independent_heads_on_helper_threads_answer_as_they_do_one_after_the_other(fused_pipelines, tmp_path):
    files, repo = fused_pipelines["branching"]
    auto = example_model(repo, "embed_and_tag")
    # At load the two heads were timed on helper threads and one after the other; the log says which won.
    assert "branches: inline (on 2 threads" in auto.graph.describe() or \
        "branches: on 2 threads (" in auto.graph.describe()
    copy = copy_of(fused_pipelines, "branching", tmp_path)
    path = copy / "embed_and_tag" / "1" / "graph.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "branches": "parallel"}))
    parallel = example_model(copy, "embed_and_tag")
    assert "branches: on 2 threads (branches: parallel)" in parallel.graph.describe()
    requests = PIPELINES["branching"].requests(10, seed=8)
    reference = InProcess(files, "branching")

    for response, request in zip(parallel.execute([InferenceRequest(r) for r in requests]), requests):
        got, want = outputs_of(response), reference(request)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)
    auto.finalize()
    parallel.finalize()


def test_between_two_torch_steps_the_tensor_stays_a_torch_tensor_on_their_device(tmp_path):
    """encoder (TorchScript) -> topics (TorchScript): the encoder's output goes to the topic head
    as a torch tensor (on a GPU it would stay on the device); the answers are the two models'."""
    import torch

    from latte.examples import CATALOG, export

    model_dir = tmp_path / "repo" / "tag"
    steps = {}
    for step, example in (("encoder", "sequence"), ("topics", "topics")):
        files = export(CATALOG[example], tmp_path / "build" / example)
        folder = model_dir / "1" / "steps" / step / "1"
        folder.mkdir(parents=True)
        shutil.copy(files["torchscript"], folder / "model.pt")
        steps[step] = files["torchscript"]
    tokens = {"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1]}
    topics = {"name": "TOPICS", "data_type": "TYPE_FP32", "dims": [4]}

    def config(name, inputs, outputs, **parameters):
        return {"name": name, "backend": "latte", "max_batch_size": 16, "input": inputs, "output": outputs,
                "parameters": {"model_file": {"string_value": "model.pt"},
                               **{k: {"string_value": v} for k, v in parameters.items()}}}

    (model_dir / "1" / "graph.json").write_text(json.dumps({
        "format": "latte-graph/1", "inputs": [tokens], "outputs": [topics],
        "steps": [{"name": "encoder", "folder": "steps/encoder", "inputs": {"tokens": "tokens"},
                   "outputs": {"embedding": "pooled"},
                   "config": config("encoder", [{**tokens, "allow_ragged_batch": True}],
                                    [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [32]}],
                                    max_sequence_length="128")},
                  {"name": "topics", "folder": "steps/topics", "inputs": {"embedding": "pooled"},
                   "outputs": {"topics": "TOPICS"},
                   "config": config("topics", [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [32]}],
                                    [{"name": "topics", "data_type": "TYPE_FP32", "dims": [4]}])}]}))
    (model_dir / "config.pbtxt").write_text('''name: "tag"
backend: "latte"
max_batch_size: 16
input { name: "tokens" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true }
output { name: "TOPICS" data_type: TYPE_FP32 dims: [ 4 ] }
parameters { key: "model_file" value: { string_value: "graph.json" } }
parameters { key: "max_sequence_length" value: { string_value: "128" } }
''')
    model = example_model(tmp_path / "repo", "tag")
    encoder, head = model.graph.steps
    assert encoder.keeps_tensors and not head.keeps_tensors  # the head's output is answered: numpy
    assert "encoder (model, tensors kept on cpu)" in model.graph.describe()
    rng = np.random.default_rng(4)
    feeds = [{"tokens": rng.integers(1, 1000, size=(1, n), dtype=np.int64)} for n in (5, 40, 12, 90)]

    responses = model.execute([InferenceRequest(f) for f in feeds])

    modules = {name: torch.jit.load(str(path)).eval() for name, path in steps.items()}
    for feed, response in zip(feeds, responses):
        with torch.inference_mode():
            want = modules["topics"](modules["encoder"](torch.from_numpy(feed["tokens"]))).numpy()
        np.testing.assert_allclose(outputs_of(response)["TOPICS"], want, rtol=1e-4, atol=1e-5)
    model.finalize()
