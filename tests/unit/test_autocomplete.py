import json

from latte.backend.autocomplete import complete, stub_version_dir


def test_onnx_graph_fills_inputs_outputs_and_batching(example_repo):
    version_dir = example_repo / "sequence_onnx" / "1"
    additions = complete({"name": "sequence_onnx", "backend": "latte"}, version_dir)
    assert additions["max_batch_size"] == 8
    assert additions["inputs"] == [{"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1]}]
    assert additions["outputs"] == [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [32]}]
    assert additions["dynamic_batching"] is True


def test_a_config_that_names_its_tensors_is_left_alone(example_repo):
    config = {"name": "m", "max_batch_size": 4, "input": [{"name": "features"}], "output": [{"name": "logits"}]}
    assert complete(config, example_repo / "mlp_onnx" / "1") == {}


def test_a_sidecar_json_describes_torchscript_models(tmp_path):
    version_dir = tmp_path / "1"
    version_dir.mkdir()
    (version_dir / "model.pt").write_bytes(b"")
    (version_dir / "model.pt.json").write_text(json.dumps({
        "max_batch_size": 16,
        "inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
        "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1, 2]}]}))
    additions = complete({"name": "m"}, version_dir)
    assert additions["max_batch_size"] == 16
    assert additions["inputs"][0]["dims"] == [4] and additions["outputs"][0]["dims"] == [2]


def test_the_version_folder_comes_from_the_stub_command_line(tmp_path):
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"/x/triton_python_backend_stub\0/repo/m/1/model.py\0region\0")
    assert str(stub_version_dir(str(cmdline))) == "/repo/m/1"
    cmdline.write_bytes(b"/usr/bin/python3\0-m\0pytest\0")
    assert stub_version_dir(str(cmdline)) is None
