"""A config that names only the backend is completed from the ONNX graph and served."""

import shutil

import numpy as np

from latte.triton import TritonServer


def test_minimal_onnx_config_is_completed_and_served(example_repo, tmp_path):
    repo = tmp_path / "repo"
    (repo / "tiny" / "1").mkdir(parents=True)
    shutil.copy(example_repo / "mlp_onnx" / "1" / "model.onnx", repo / "tiny" / "1" / "model.onnx")
    (repo / "tiny" / "config.pbtxt").write_text('name: "tiny"\nbackend: "latte"\n')
    import tritonclient.http as httpclient

    with TritonServer(repo, log_path=tmp_path / "log") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        config = client.get_model_config("tiny")
        assert config["max_batch_size"] == 8
        assert [i["name"] for i in config["input"]] == ["features"]
        assert "dynamic_batching" in config
        x = httpclient.InferInput("features", [3, 16], "FP32")
        x.set_data_from_numpy(np.ones((3, 16), np.float32))
        assert client.infer("tiny", [x]).as_numpy("logits").shape == (3, 8)
        client.close()  # the server waits for open connections when it stops


def test_minimal_torch_export_config_is_completed_and_served(tmp_path):
    """A .pt2 with a dynamic batch and sequence length: inputs are named after forward's
    arguments, the output is `output0`, and the answers equal the module's own."""
    import torch

    from latte.examples.models import SequenceEncoder

    torch.manual_seed(0)
    module = SequenceEncoder().eval()
    batch, length = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=2, max=128)
    program = torch.export.export(module, (torch.randint(1, 1000, (2, 7)),),
                                  dynamic_shapes={"tokens": {0: batch, 1: length}})
    repo = tmp_path / "repo"
    (repo / "encoder" / "1").mkdir(parents=True)
    torch.export.save(program, str(repo / "encoder" / "1" / "model.pt2"))
    (repo / "encoder" / "config.pbtxt").write_text('name: "encoder"\nbackend: "latte"\n')
    import tritonclient.http as httpclient

    tokens = np.random.default_rng(3).integers(1, 1000, (3, 11))
    with TritonServer(repo, log_path=tmp_path / "log") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        config = client.get_model_config("encoder")
        assert config["max_batch_size"] == 8
        assert [(i["name"], i["data_type"], [int(d) for d in i["dims"]]) for i in config["input"]] == \
            [("tokens", "TYPE_INT64", [-1])]
        assert [(o["name"], [int(d) for d in o["dims"]]) for o in config["output"]] == [("output0", [32])]
        x = httpclient.InferInput("tokens", list(tokens.shape), "INT64")
        x.set_data_from_numpy(tokens)
        served = client.infer("encoder", [x]).as_numpy("output0")
        client.close()  # the server waits for open connections when it stops
    with torch.inference_mode():
        expected = module(torch.from_numpy(tokens)).numpy()
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-5)
