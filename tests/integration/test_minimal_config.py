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
