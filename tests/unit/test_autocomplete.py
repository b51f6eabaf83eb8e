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


def _export(module, example_args, dynamic_shapes, version_dir):
    import torch

    version_dir.mkdir(parents=True, exist_ok=True)
    program = torch.export.export(module.eval(), example_args, dynamic_shapes=dynamic_shapes)
    torch.export.save(program, str(version_dir / "model.pt2"))
    return version_dir


def test_an_exported_program_with_dynamic_batch_and_sequence_fills_the_config(tmp_path):
    import numpy as np
    import torch

    from latte.backend.runtimes import load_runtime
    from latte.examples.models import SequenceEncoder

    torch.manual_seed(0)
    module = SequenceEncoder()
    batch, length = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=2, max=128)
    version_dir = _export(module, (torch.randint(1, 1000, (2, 7)),), {"tokens": {0: batch, 1: length}}, tmp_path / "1")

    additions = complete({"name": "encoder", "backend": "latte"}, version_dir)

    assert additions["max_batch_size"] == 8
    assert additions["inputs"] == [{"name": "tokens", "data_type": "TYPE_INT64", "dims": [-1]}]
    assert additions["outputs"] == [{"name": "output0", "data_type": "TYPE_FP32", "dims": [32]}]
    assert additions["dynamic_batching"] is True
    # The completed names are the ones the torch runtime serves under.
    runtime = load_runtime("torch_export", version_dir / "model.pt2", ["tokens"], ["output0"], 1, 1)
    tokens = np.random.default_rng(0).integers(1, 1000, (3, 11))
    expected = module(torch.from_numpy(tokens)).detach().numpy()
    np.testing.assert_allclose(runtime.run({"tokens": tokens})["output0"], expected, rtol=1e-5, atol=1e-5)


def test_an_exported_program_names_inputs_by_argument_and_dict_outputs_by_key(tmp_path):
    import torch

    class TwoHeads(torch.nn.Module):
        def forward(self, image, scale):
            pooled = image.mean(dim=(2, 3)) * scale
            return {"pooled": pooled, "mask": image[:, 0] > 0}

    batch = torch.export.Dim("batch", min=1, max=32)
    version_dir = _export(TwoHeads(), (torch.randn(2, 3, 8, 8), torch.ones(2, 3)),
                          {"image": {0: batch}, "scale": {0: batch}}, tmp_path / "1")

    additions = complete({"name": "heads", "max_batch_size": 4}, version_dir)

    assert "max_batch_size" not in additions  # the config's own value stays
    assert additions["inputs"] == [{"name": "image", "data_type": "TYPE_FP32", "dims": [3, 8, 8]},
                                   {"name": "scale", "data_type": "TYPE_FP32", "dims": [3]}]
    assert additions["outputs"] == [{"name": "pooled", "data_type": "TYPE_FP32", "dims": [3]},
                                    {"name": "mask", "data_type": "TYPE_BOOL", "dims": [8, 8]}]


def test_an_exported_program_with_static_shapes_is_not_batched(tmp_path):
    import torch

    from latte.examples.models import MLP

    version_dir = _export(MLP(), (torch.randn(2, 16),), None, tmp_path / "1")
    additions = complete({"name": "mlp"}, version_dir)
    assert "max_batch_size" not in additions and "dynamic_batching" not in additions
    assert additions["inputs"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [2, 16]}]
    assert additions["outputs"] == [{"name": "output0", "data_type": "TYPE_FP32", "dims": [2, 8]}]


def test_torchscript_without_a_sidecar_names_what_to_add(tmp_path):
    import pytest

    from latte.backend.config import ConfigError

    version_dir = tmp_path / "1"
    version_dir.mkdir()
    (version_dir / "model.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"model\.pt: TorchScript records no tensor shapes.*model\.pt\.json"):
        complete({"name": "m", "backend": "latte"}, version_dir)
