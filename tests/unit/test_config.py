import json
from pathlib import Path

import numpy as np
import pytest

from latte.backend.config import ConfigError, parse_args, parse_model_config, usable_cores


def _model_dir(tmp_path: Path, filename="model.onnx") -> Path:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / filename).write_bytes(b"not read by the parser")
    return tmp_path / "m"


def _config(**overrides):
    config = {
        "name": "m",
        "max_batch_size": 8,
        "input": [{"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1], "allow_ragged_batch": True}],
        "output": [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [32]}],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {"max_sequence_length": {"string_value": "64"}},
    }
    config.update(overrides)
    return config


def test_spec_describes_the_model(tmp_path):
    spec = parse_model_config(_config(), _model_dir(tmp_path), "1")
    assert spec.runtime == "onnx"  # detected from the extension
    assert spec.model_path.name == "model.onnx"
    assert spec.inputs[0].dtype == np.int64 and spec.inputs[0].ragged
    assert spec.max_sequence_length == 64
    assert spec.intra_op_threads == 1 and spec.inter_op_threads == 1  # explicit, never library defaults


def test_parse_args_reads_what_triton_passes(tmp_path):
    args = {"model_config": json.dumps(_config()), "model_repository": str(tmp_path / "m"), "model_version": "3"}
    config, model_dir, version = parse_args(args)
    assert config["name"] == "m" and model_dir == tmp_path / "m" and version == "3"


@pytest.mark.parametrize("overrides, message", [
    ({"input": []}, "declares no input"),
    ({"max_batch_size": 0}, "allow_ragged_batch needs max_batch_size > 0"),
    ({"parameters": {"runtime": {"string_value": "tensorflow"}}}, "expected one of"),
    ({"parameters": {"model_file": {"string_value": "missing.onnx"}}}, "does not exist"),
    ({"parameters": {"intra_op_threads": {"string_value": "zero"}}}, "must be an integer"),
    ({"parameters": {"pad_value": {"string_value": "x"}}}, "pad_value"),
    ({"output": [{"name": "y", "data_type": "TYPE_STRING", "dims": [1]}]}, "not supported"),
    ({"parameters": {"valid_range:tokens": {"string_value": "999..0"}}}, r"valid_range:tokens.*LOW\.\.HIGH"),
    ({"parameters": {"valid_range:words": {"string_value": "0..9"}}}, "names no input"),
])
def test_bad_configs_are_refused_with_the_key_named(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        parse_model_config(_config(**overrides), _model_dir(tmp_path), "1")


def test_thread_budget_cannot_exceed_usable_cores(tmp_path):
    cores = usable_cores()
    config = _config(instance_group=[{"count": cores, "kind": "KIND_CPU"}],
                     parameters={"intra_op_threads": {"string_value": "2"}})
    with pytest.raises(ConfigError, match=f"exceed the {cores} core"):
        parse_model_config(config, _model_dir(tmp_path), "1")


def test_an_integer_input_declares_its_valid_range(tmp_path):
    config = _config(parameters={"valid_range:tokens": {"string_value": "0..999"}})
    spec = parse_model_config(config, _model_dir(tmp_path), "1")
    assert spec.inputs[0].valid_range == (0, 999)
    floats = _config(input=[{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
                     parameters={"valid_range:x": {"string_value": "0..1"}})
    with pytest.raises(ConfigError, match="needs an integer input"):
        parse_model_config(floats, _model_dir(tmp_path / "f"), "1")


def test_max_queue_size_bounds_the_pipelined_queue(tmp_path):
    params = {"pipeline": {"string_value": "true"}, "max_queue_size": {"string_value": "16"}}
    spec = parse_model_config(_config(parameters=params), _model_dir(tmp_path), "1")
    assert spec.scheduler == "affinity" and spec.max_queue_size == 16


@pytest.mark.parametrize("params, message", [
    ({"pipeline": "true", "max_queue_size": "0"}, r"parameters\['max_queue_size'\] must be >= 1, got 0"),
    ({"pipeline": "true", "max_queue_size": "lots"}, r"parameters\['max_queue_size'\] must be an integer, got 'lots'"),
    ({"max_queue_size": "16"}, "bounds the queue of the scheduler lanes, and this model runs inline"),
])
def test_a_max_queue_size_that_cannot_apply_is_refused(tmp_path, params, message):
    config = _config(parameters={key: {"string_value": value} for key, value in params.items()})
    with pytest.raises(ConfigError, match=message):
        parse_model_config(config, _model_dir(tmp_path), "1")
