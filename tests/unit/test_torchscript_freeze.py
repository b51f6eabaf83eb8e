"""TorchScript is frozen at load: weights become constants of the graph, results stay the same
bit for bit; `freeze: false` serves the module as loaded; a module torch cannot freeze serves
as loaded, and the ready line says why."""

import numpy as np
import pytest
import torch

from latte.backend.config import parse_model_config
from latte.backend.errors import ConfigError
from latte.backend.graph.graph import load_model
from latte.backend.runtimes import load_runtime
from latte.examples.stream_models import gpt_programs


@pytest.fixture()
def decode_path(tmp_path):
    _, decode, dims = gpt_programs(seed=3)
    path = tmp_path / "decode.pt"
    decode.save(str(path))
    return path, dims


def _feed(dims, batch=3, width=32):
    rng = np.random.default_rng(1)
    return {"token": rng.integers(1, 90, size=(batch, 1)).astype(np.int64),
            "cache": rng.standard_normal((batch, width, *dims)).astype(np.float32),
            "cache_lengths": np.array([[5], [17], [30]], dtype=np.int64)}


def test_a_frozen_module_holds_no_parameters_and_answers_the_same_bits(decode_path):
    path, dims = decode_path
    names = (["token", "cache", "cache_lengths"], ["next_token", "row"])
    frozen = load_runtime("torchscript", path, *names, 1, 1)
    loaded = load_runtime("torchscript", path, *names, 1, 1, freeze=False)
    assert list(frozen.module.parameters()) == []
    assert len(list(loaded.module.parameters())) > 0
    assert frozen.notes == [] and loaded.notes == []
    # The decode writes into the cache it is handed: each runtime gets its own copy.
    feed = _feed(dims)
    ours = frozen.run({k: v.copy() for k, v in feed.items()})
    theirs = loaded.run({k: v.copy() for k, v in feed.items()})
    for name in ("next_token", "row"):
        np.testing.assert_array_equal(ours[name], theirs[name])


def test_a_module_torch_cannot_freeze_runs_as_loaded_and_says_why(decode_path, monkeypatch):
    path, dims = decode_path

    def refuse(module, **kwargs):
        raise RuntimeError("cannot freeze this module\nsecond line of torch's text")

    monkeypatch.setattr(torch.jit, "freeze", refuse)
    runtime = load_runtime("torchscript", path, ["token", "cache", "cache_lengths"], ["next_token", "row"], 1, 1)
    assert runtime.notes == ["TorchScript runs unfrozen (torch.jit.freeze: cannot freeze this module)"]
    assert len(list(runtime.module.parameters())) > 0
    assert runtime.run(_feed(dims))["next_token"].shape == (3, 1)


def _config(**parameters):
    return {"name": "decode", "backend": "latte", "max_batch_size": 0,
            "input": [{"name": "token", "data_type": "TYPE_INT64", "dims": [-1, 1]},
                      {"name": "cache", "data_type": "TYPE_FP32", "dims": [-1, -1, 2, 2, 4, 16]},
                      {"name": "cache_lengths", "data_type": "TYPE_INT64", "dims": [-1, 1]}],
            "output": [{"name": "next_token", "data_type": "TYPE_INT64", "dims": [-1, 1]},
                       {"name": "row", "data_type": "TYPE_FP32", "dims": [-1, 2, 2, 4, 16]}],
            "parameters": {k: {"string_value": v} for k, v in parameters.items()}}


def test_the_freeze_parameter_reaches_the_runtime_and_the_ready_line(decode_path, monkeypatch):
    path, _ = decode_path
    version = path.parent / "1"
    version.mkdir()
    path.rename(version / "model.pt")
    assert parse_model_config(_config(), path.parent, "1").serving.freeze is True
    spec = parse_model_config(_config(freeze="false"), path.parent, "1")
    assert spec.serving.freeze is False
    graph, _ = load_model(spec)
    assert len(list(graph.steps[0].runtime.module.parameters())) > 0
    monkeypatch.setattr(torch.jit, "freeze", lambda module, **kwargs: (_ for _ in ()).throw(RuntimeError("no")))
    graph, _ = load_model(parse_model_config(_config(), path.parent, "1"))
    assert graph.describe() == "TorchScript runs unfrozen (torch.jit.freeze: no)"
    with pytest.raises(ConfigError, match="freeze"):
        parse_model_config(_config(freeze="sometimes"), path.parent, "1")


def test_outputs_are_made_in_inference_mode_whether_frozen_or_not(decode_path):
    path, dims = decode_path
    names = (["token", "cache", "cache_lengths"], ["next_token", "row"])
    for freeze in (True, False):
        runtime = load_runtime("torchscript", path, *names, 1, 1, freeze=freeze)
        outputs = runtime.run_tensors(_feed(dims))
        assert all(t.is_inference() and not t.requires_grad for t in outputs.values())
        assert not torch.is_inference_mode_enabled()  # the mode ends with the call
