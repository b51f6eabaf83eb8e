"""torch.export programs (.pt2) run through the same runtime interface as TorchScript."""

import numpy as np
import torch

from latte.backend.config import detect_runtime
from latte.backend.runtimes import load_runtime
from latte.examples.models import MLP


def test_an_exported_program_serves_with_a_dynamic_batch(tmp_path):
    torch.manual_seed(0)
    module = MLP().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(module, (torch.randn(2, 16),), dynamic_shapes={"x": {0: batch}})
    path = tmp_path / "model.pt2"
    torch.export.save(program, str(path))
    assert detect_runtime(path) == "torch_export"
    runtime = load_runtime("torch_export", path, ["x"], ["logits"], 1, 1)
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    out = runtime.run({"x": x})["logits"]
    np.testing.assert_allclose(out, module(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
