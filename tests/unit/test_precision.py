"""Reduced precision is admitted only with an accuracy report, and refused past the tolerance."""

import numpy as np
import pytest

from example_models import example_spec
from latte.backend.config import ConfigError
from latte.backend.precision import load_at_precision
from latte.backend.warmup import warmup_shapes


def test_int8_onnx_is_served_with_its_measured_accuracy(example_repo):
    spec = example_spec(example_repo, "mlp_onnx", precision="int8", accuracy_tolerance="0.3")
    runtime, report = load_at_precision(spec, warmup_shapes(spec))
    assert report is not None and 0 < report.relative_l2 <= 0.3
    assert 0.5 <= report.top1_agreement <= 1.0
    out = runtime.run({"features": np.ones((2, 16), np.float32)})
    assert out["logits"].shape == (2, 8)


def test_int8_past_the_tolerance_refuses_to_load(example_repo):
    spec = example_spec(example_repo, "mlp_onnx", precision="int8", accuracy_tolerance="1e-9")
    with pytest.raises(ConfigError, match=r"int8 vs fp32: relative L2 error .* exceeds accuracy_tolerance=1e-09"):
        load_at_precision(spec, warmup_shapes(spec))


@pytest.mark.parametrize("model, params, message", [
    ("mlp_torchscript", {"precision": "int8"}, "int8 is available for ONNX models"),
    ("mlp_torchscript", {"precision": "fp16"}, "fp16 needs a torch model on a GPU instance"),
    ("mlp_onnx", {"precision": "int4"}, "expected one of"),
])
def test_unavailable_precisions_are_refused_before_loading(example_repo, model, params, message):
    with pytest.raises(ConfigError, match=message):
        example_spec(example_repo, model, **params)
