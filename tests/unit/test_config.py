import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from latte.backend.config import (ConfigError, ServingOptions, parse_args, parse_model_config, thread_budget_warning,
                                  usable_cores)


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
    assert spec.signature.runtime == "onnx"  # detected from the extension
    assert spec.signature.model_path.name == "model.onnx"
    assert spec.signature.inputs[0].dtype == np.int64 and spec.signature.inputs[0].ragged
    assert spec.serving.max_sequence_length == 64
    assert spec.serving.intra_op_threads == 1 and spec.serving.inter_op_threads == 1  # explicit, never library defaults


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
    ({"output": [{"name": "y", "data_type": "TYPE_BF16", "dims": [1]}]}, "not supported"),
    ({"input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [-1], "allow_ragged_batch": True}]},
     "strings are not padded"),
    ({"parameters": {"valid_range:tokens": {"string_value": "999..0"}}}, r"valid_range:tokens.*LOW\.\.HIGH"),
    ({"parameters": {"valid_range:words": {"string_value": "0..9"}}}, "names no input"),
])
def test_bad_configs_are_refused_with_the_key_named(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        parse_model_config(_config(**overrides), _model_dir(tmp_path), "1")


def test_multi_threaded_instances_cannot_exceed_usable_cores(tmp_path):
    cores = usable_cores()
    config = _config(instance_group=[{"count": cores, "kind": "KIND_CPU"}],
                     parameters={"intra_op_threads": {"string_value": "2"}})
    with pytest.raises(ConfigError, match=f"= {2 * cores} threads exceed the {cores} core.*"
                                          f"multi-threaded instances must fit the cores"):
        parse_model_config(config, _model_dir(tmp_path), "1")


def test_more_single_threaded_instances_than_cores_load_with_a_warning(tmp_path):
    cores = usable_cores()
    config = _config(instance_group=[{"count": cores + 1, "kind": "KIND_CPU"}])
    spec = parse_model_config(config, _model_dir(tmp_path), "1")
    budget = spec.serving.thread_budget
    assert (budget.threads, budget.cores, budget.state) == (cores + 1, cores, "oversubscribed")
    assert thread_budget_warning(spec) == (
        f"model 'm': {cores + 1} instance(s) x lanes=1 x intra_op_threads=1 = {cores + 1} threads on {cores} "
        f"core(s); they take turns on the cores, so each call may wait for another's time slice")


def test_instances_within_the_cores_load_without_a_warning(tmp_path):
    spec = parse_model_config(_config(), _model_dir(tmp_path), "1")
    assert spec.serving.thread_budget.state == "within"
    assert thread_budget_warning(spec) is None


def test_serving_defaults_are_those_of_a_config_without_parameters(tmp_path):
    config = _config(parameters={})
    spec = parse_model_config(config, _model_dir(tmp_path), "1")
    assert replace(spec.serving, thread_budget=ServingOptions().thread_budget) == ServingOptions()
    assert spec.serving.scheduler == "inline"  # one lane, no async_execute


@pytest.mark.parametrize("parameters, scheduler", [
    ({"lanes": "2"}, "affinity"),
    ({"async_execute": "true"}, "affinity"),
    ({"scheduler": "affinity"}, "affinity"),
    ({}, "inline"),
])
def test_auto_scheduler_uses_lanes_only_where_they_help(tmp_path, parameters, scheduler):
    config = _config(parameters={k: {"string_value": v} for k, v in parameters.items()})
    assert parse_model_config(config, _model_dir(tmp_path), "1").serving.scheduler == scheduler


def test_a_reduced_precision_is_parsed_with_its_tolerance(tmp_path):
    config = _config(parameters={"precision": {"string_value": "INT8"},
                                 "accuracy_tolerance": {"string_value": "0.05"}})
    serving = parse_model_config(config, _model_dir(tmp_path), "1").serving
    assert (serving.precision, serving.accuracy_tolerance) == ("int8", 0.05)
    config["parameters"]["accuracy_tolerance"] = {"string_value": "0"}
    with pytest.raises(ConfigError, match=r"accuracy_tolerance\"\] must be > 0"):
        parse_model_config(config, _model_dir(tmp_path / "zero"), "1")


def test_an_integer_input_declares_its_valid_range(tmp_path):
    config = _config(parameters={"valid_range:tokens": {"string_value": "0..999"}})
    spec = parse_model_config(config, _model_dir(tmp_path), "1")
    assert spec.signature.inputs[0].valid_range == (0, 999)
    floats = _config(input=[{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
                     parameters={"valid_range:x": {"string_value": "0..1"}})
    with pytest.raises(ConfigError, match="needs an integer input"):
        parse_model_config(floats, _model_dir(tmp_path / "f"), "1")


def test_max_queue_size_bounds_the_async_execute_queue(tmp_path):
    params = {"async_execute": {"string_value": "true"}, "max_queue_size": {"string_value": "16"}}
    spec = parse_model_config(_config(parameters=params), _model_dir(tmp_path), "1")
    assert spec.serving.scheduler == "affinity" and spec.serving.max_queue_size == 16


@pytest.mark.parametrize("params, message", [
    ({"async_execute": "true", "max_queue_size": "0"}, r"parameters\['max_queue_size'\] must be >= 1, got 0"),
    ({"async_execute": "true", "max_queue_size": "lots"}, r"parameters\['max_queue_size'\] must be an integer, got 'lots'"),
    ({"max_queue_size": "16"}, "bounds the queue of the scheduler lanes, and this model runs inline"),
])
def test_a_max_queue_size_that_cannot_apply_is_refused(tmp_path, params, message):
    config = _config(parameters={key: {"string_value": value} for key, value in params.items()})
    with pytest.raises(ConfigError, match=message):
        parse_model_config(config, _model_dir(tmp_path), "1")


def test_the_old_name_of_async_execute_is_refused_with_its_new_name(tmp_path):
    config = _config(parameters={"pipeline": {"string_value": "true"}})
    with pytest.raises(ConfigError, match=r"parameters\[.pipeline.\] is now called async_execute"):
        parse_model_config(config, _model_dir(tmp_path), "1")


def test_a_gpu_instance_chooses_how_torch_holds_its_memory(tmp_path):
    config = _config(parameters={"device_allocator": {"string_value": "Arena"},
                                 "device_arena_bytes": {"string_value": str(256 << 20)}})
    serving = parse_model_config(config, _model_dir(tmp_path, "model.pt"), "1", device="cuda:0").serving
    assert (serving.device_allocator, serving.device_arena_bytes) == ("arena", 256 << 20)
    default = parse_model_config(_config(), _model_dir(tmp_path / "default", "model.pt"), "1", device="cuda:0").serving
    assert (default.device_allocator, default.device_arena_bytes) == ("caching", 1 << 30)


@pytest.mark.parametrize("filename, device, params, message", [
    ("model.pt", "cpu", {"device_allocator": "arena"}, r"this instance runs on the CPU \(set instance_group kind: KIND_GPU\)"),
    ("model.onnx", "cuda:0", {"device_allocator": "expandable"}, r"applies to torch models \(this one is onnx\)"),
    ("model.pt", "cuda:0", {"device_arena_bytes": "1048576"}, r"device_allocator is 'caching'"),
    ("model.pt", "cuda:0", {"device_allocator": "slab"}, r"must be caching, expandable or arena, got 'slab'"),
    ("model.pt", "cuda:0", {"device_allocator": "arena", "device_arena_bytes": "4096"}, r"must be >= 1048576"),
])
def test_a_device_allocator_that_cannot_apply_is_refused(tmp_path, filename, device, params, message):
    config = _config(parameters={k: {"string_value": v} for k, v in params.items()})
    with pytest.raises(ConfigError, match=message):
        parse_model_config(config, _model_dir(tmp_path, filename), "1", device=device)


@pytest.mark.parametrize("parameters, device, paged", [
    ({}, "cpu", True),                                            # a CPU instance's arena is paged
    ({}, "cuda:0", False),                                        # a GPU instance's stays page-locked
    ({"arena_bytes": str(512 << 10)}, "cpu", False),              # an arena under one page cannot be
    ({"arena_pages": "false"}, "cpu", False),
    ({"arena_pages": "true"}, "cuda:0", True),
])
def test_the_arena_is_paged_by_default_on_a_cpu_instance(tmp_path, parameters, device, paged):
    config = _config(parameters={k: {"string_value": v} for k, v in parameters.items()})
    serving = parse_model_config(config, _model_dir(tmp_path), "1", device=device).serving
    assert (serving.arena_pages, serving.arena_pages_asked) == (paged, "arena_pages" in parameters)


def test_a_config_carrying_latte_serves_health_rules_loads(tmp_path):
    """The supervisor reads these parameters; the backend serves the model as without them."""
    rules = {"execute_timeout_s": "5", "health_p99_slo_ms": "20", "health_p99_window_s": "120",
             "health_cpu_pegged_percent": "90", "health_cpu_pegged_s": "120", "rejuvenate_min_interval_s": "600",
             "health_rss_growth_mib_per_min": "4"}
    config = _config()
    config["parameters"] = {**config["parameters"], **{k: {"string_value": v} for k, v in rules.items()}}
    with_rules = parse_model_config(config, _model_dir(tmp_path / "with"), "1")
    without = parse_model_config(_config(), _model_dir(tmp_path / "without"), "1")
    assert with_rules.serving == without.serving
    assert with_rules.signature.runtime == "onnx"
