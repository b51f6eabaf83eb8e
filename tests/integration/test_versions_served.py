"""End to end: a spec with two versions, version_policy and the response cache -> generate -> validate -> serve."""

import textwrap

import numpy as np
import pytest

from conftest import assert_stopped_promptly

pytestmark = pytest.mark.integration

STEP = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * {factor})]) for r in requests]
'''

SPEC = """\
models:
  - name: scale
    versions:
      - {version: 1, file: scale_v1.py}
      - {version: 2, file: scale_v2.py}
    version_policy: all
    response_cache: true
    max_batch_size: 4
    inputs:  [{name: X, data_type: FP32, dims: [2]}]
    outputs: [{name: Y, data_type: FP32, dims: [2]}]
"""


def test_both_versions_serve_and_repeats_come_from_the_cache(tmp_path, capsys):
    import tritonclient.http as httpclient

    from latte.cli import main
    from latte.triton import TritonServer

    for version, factor in ((1, "np.float32(1)"), (2, "np.float32(2)")):
        (tmp_path / f"scale_v{version}.py").write_text(textwrap.dedent(STEP).format(factor=factor))
    (tmp_path / "spec.yaml").write_text(SPEC)
    repo = tmp_path / "repo"
    assert main(["generate", str(tmp_path / "spec.yaml"), "-o", str(repo)]) == 0
    assert main(["validate", str(repo)]) == 0
    capsys.readouterr()

    x = np.array([[1.5, -2.0]], dtype=np.float32)
    with TritonServer(repo) as server:
        client = httpclient.InferenceServerClient(server.http_url)

        def infer(version: str) -> np.ndarray:
            inp = httpclient.InferInput("X", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            return client.infer("scale", [inp], model_version=version).as_numpy("Y")

        np.testing.assert_array_equal(infer("1"), x)
        np.testing.assert_array_equal(infer("2"), 2 * x)
        for _ in range(3):
            np.testing.assert_array_equal(infer("2"), 2 * x)
        (v2,) = client.get_inference_statistics("scale", "2")["model_stats"]
        assert v2["inference_stats"]["cache_hit"]["count"] == 3
        assert v2["execution_count"] == 1
        client.close()
    assert_stopped_promptly(server)
