"""`latte fuse` on a repository written the way Triton users write theirs: each Python model
ships its own `utils.py` (the two differ), reads a file from args["model_repository"] and one
row per request. The fused model loads, answers as the steps do one after another, keeps each
step's helpers to itself, and a step that fails to load is named with its own error."""

import importlib.util
import shutil
import sys

import numpy as np
import pytest

from example_models import example_model
from latte.backend.errors import ConfigError
from latte.backend.standin_stub import InferenceRequest

TEXTS = [b"the quick brown fox", b"latte serves", b"words outside the vocabulary file", b""]


@pytest.fixture(scope="module")
def user_repo(tmp_path_factory):
    from latte.examples.user_repository import write_user_repository
    from latte.generator.fuse import fuse_repository

    work = tmp_path_factory.mktemp("user")
    repo = write_user_repository(work / "repo")
    fuse_repository(repo, "embed_text", work / "fused")
    return repo, work / "fused"


def helper(path):
    """A step's helper module imported on its own, as the step's own process imports it."""
    spec = importlib.util.spec_from_file_location(f"reference_{path.parent.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(repo, encoder, text):
    """What the ensemble computes for one text: the steps' own code, one after another."""
    vocabulary = helper(repo / "tokenize" / "1" / "utils.py").Vocabulary(repo / "tokenize" / "1" / "vocab.txt")
    tokens = np.array([vocabulary.encode(text)], dtype=np.int64)
    (response,) = encoder.execute([InferenceRequest({"tokens": tokens})])
    raw = response.output_tensors()[0].as_numpy()[0]
    unit, norm = helper(repo / "normalize" / "1" / "utils.py").scale(raw, 1e-12)
    return {"EMBEDDING": unit[None].astype(np.float32), "NORM": np.array([[norm]], dtype=np.float32)}


def test_steps_shipping_same_named_helpers_fuse_and_answer_as_the_steps_do(user_repo):
    repo, fused = user_repo
    modules_before = set(sys.modules)
    model = example_model(fused, "embed_text")
    encoder = example_model(repo, "encoder")
    try:
        assert "utils" not in sys.modules  # each step's helper stays in its own namespace
        responses = model.execute([InferenceRequest({"TEXT": np.array([[t]], dtype=object)}) for t in TEXTS])
        for text, response in zip(TEXTS, responses):
            assert not response.has_error(), response.error().message()
            got = {t.name(): t.as_numpy() for t in response.output_tensors()}
            want = reference(repo, encoder, text)
            assert sorted(got) == sorted(want)
            for name, array in want.items():
                assert got[name].shape == array.shape and got[name].dtype == array.dtype, name
                np.testing.assert_allclose(got[name], array, rtol=1e-5, atol=1e-6)
    finally:
        model.finalize()
        encoder.finalize()
    # Unloaded, the steps leave no module of theirs behind.
    assert not {name for name in set(sys.modules) - modules_before if name.startswith("_latte_step_")}


def test_a_step_that_reads_one_row_answers_a_request_of_two_with_the_step_named(user_repo):
    _, fused = user_repo
    model = example_model(fused, "embed_text")
    try:
        (response,) = model.execute([InferenceRequest({"TEXT": np.array([[b"one"], [b"two"]], dtype=object)})])
        assert response.has_error()
        message = response.error().message()
        assert message.startswith("model 'embed_text': step 'tokenize' failed: RuntimeError: answered output "
                                  "'TOKENS' with shape [1, 1] for a request of 2 row(s)"), message
    finally:
        model.finalize()


def broken_copy(fused, tmp_path, step, file, text=None):
    target = tmp_path / "fused"
    shutil.copytree(fused, target)
    path = target / "embed_text" / "1" / "steps" / step / "1" / file
    if text is None:
        path.unlink()
    else:
        path.write_text(text)
    return target


@pytest.mark.parametrize("step, file, text, cause", [
    ("normalize", "settings.json", None, "step 'normalize': initialize failed: FileNotFoundError: "),
    ("tokenize", "utils.py", "raise ImportError('no tokenizer here')\n",
     "step 'tokenize': importing "),
    ("encoder", "model.onnx", "not an onnx file", "step 'encoder': onnxruntime could not load "),
], ids=["initialize", "helper-import", "model-file"])
def test_a_step_that_fails_to_load_is_named_with_its_own_error(user_repo, tmp_path, step, file, text, cause):
    _, fused = user_repo
    broken = broken_copy(fused, tmp_path, step, file, text)
    with pytest.raises(ConfigError) as failure:
        example_model(broken, "embed_text")
    message = str(failure.value)
    assert cause in message, message
    assert "AttributeError" not in message
    if step == "tokenize":
        assert "no tokenizer here" in message


CLASHING_STEP = '''\
import importlib


def run(x):
    return x


module = importlib.import_module("helper")  # by name, around the step's own import statements
'''


def test_helpers_imported_by_name_around_the_import_statement_clash_with_both_files_named(tmp_path):
    from latte.backend.graph.python_model import load_step_module

    loaded = []
    try:
        for step in ("first", "second"):
            folder = tmp_path / step / "1"
            folder.mkdir(parents=True)
            (folder / "model.py").write_text(CLASHING_STEP)
            (folder / "helper.py").write_text(f"NAME = {step!r}\n")
            if step == "first":
                loaded.append(load_step_module(folder / "model.py", step))
                assert loaded[0][0].module.NAME == "first"
        with pytest.raises(ConfigError) as clash:
            load_step_module(tmp_path / "second" / "1" / "model.py", "second")
        message = str(clash.value)
        assert message.startswith("step 'second': its module 'helper' (")
        assert str(tmp_path / "second" / "1" / "helper.py") in message
        assert str(tmp_path / "first" / "1" / "helper.py") in message
    finally:
        for _, namespace in loaded:
            namespace.close()
        sys.modules.pop("helper", None)


def test_warm_up_calls_are_shaped_as_clients_send_requests(user_repo):
    from latte.backend.warmup import warmup_calls
    from example_models import example_spec

    _, fused = user_repo
    spec = example_spec(fused, "embed_text")
    calls = warmup_calls(spec)
    assert [len(call) for call in calls] == [spec.signature.max_batch_size]
    assert all(request.rows == 1 and request.inputs["TEXT"].shape == (1, 1) for request in calls[0])


def test_a_model_step_in_a_graph_and_the_same_model_served_alone_take_the_same_plan(user_repo):
    repo, fused = user_repo
    model = example_model(fused, "embed_text")
    encoder = example_model(repo, "encoder")
    try:
        (step,) = [s for s in model.graph.steps if s.kind == "model"]
        # Each measured its cost at load; with the same measurements they plan alike.
        encoder.engine.planner.cost_model = step.planner.cost_model
        rng = np.random.default_rng(5)
        for count in (1, 3, 8, 8, 20):
            lengths = rng.integers(1, 128, count)
            served = [sorted(batch) for batch in encoder.engine.planner.plan([1] * count, lengths.tolist())]
            in_graph = [list(range(count)) if group is None else sorted(group.tolist())
                        for group in step.plan(lengths, count)]
            assert sorted(in_graph) == sorted(served), lengths
    finally:
        model.finalize()
        encoder.finalize()


def step_folder(root, step, files):
    folder = root / step / "1"
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder / "model.py"


def test_folders_without_an_init_file_are_each_steps_own(tmp_path):
    from latte.backend.graph.python_model import load_step_module

    loaded = []
    try:
        for step in ("first", "second"):
            model = step_folder(tmp_path, step, {"model.py": "from pre.tool import WHO\n",
                                                 "pre/tool.py": f"WHO = {step!r}\n"})
            loaded.append(load_step_module(model, step))
        assert [module.WHO for module, _ in loaded] == ["first", "second"]
    finally:
        for _, namespace in loaded:
            namespace.close()


PICKLING_STEP = '''\
import importlib
import pickle

import things


def made_by_name():
    return importlib.import_module("things")


def round_trip():
    return pickle.loads(pickle.dumps(things.Thing()))
'''


def test_a_helper_imported_by_name_is_the_same_module_the_import_statement_gave(tmp_path):
    from latte.backend.graph.python_model import load_step_module

    model = step_folder(tmp_path, "step", {"model.py": PICKLING_STEP, "things.py": "class Thing:\n    pass\n"})
    module, namespace = load_step_module(model, "step")
    try:
        with namespace.loading():
            assert module.made_by_name() is module.things
        assert isinstance(module.round_trip(), module.things.Thing)
    finally:
        namespace.close()
    assert "things" not in sys.modules


def test_a_refused_step_leaves_every_name_to_the_step_that_held_it(tmp_path):
    from latte.backend.graph.python_model import load_step_module

    by_name = "import importlib\nfor name in ('helper', 'utils'):\n    importlib.import_module(name)\n"
    first = step_folder(tmp_path, "first", {"model.py": by_name, "helper.py": "", "utils.py": ""})
    second = step_folder(tmp_path, "second", {"model.py": by_name, "helper.py": "", "utils.py": ""})
    _, namespace = load_step_module(first, "first")
    try:
        held = {name: sys.modules[name] for name in ("helper", "utils")}
        with pytest.raises(ConfigError, match="rename one of them"):
            load_step_module(second, "second")
        assert {name: sys.modules[name] for name in ("helper", "utils")} == held
    finally:
        namespace.close()
    assert "helper" not in sys.modules and "utils" not in sys.modules


def test_a_stand_in_of_the_stubs_module_shipped_beside_a_step_is_not_used(tmp_path):
    from latte.backend.graph.python_model import load_step_module, pb_utils

    model = step_folder(tmp_path, "step", {
        "model.py": "import triton_python_backend_utils as pb_utils\n",
        "triton_python_backend_utils.py": "MOCK = True\n"})
    module, namespace = load_step_module(model, "step")
    try:
        assert module.pb_utils is pb_utils() and not hasattr(module.pb_utils, "MOCK")
    finally:
        namespace.close()
