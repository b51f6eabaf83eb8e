"""The example networks give a padded sequence the same result as the sequence alone, which
is what lets the backend pad ragged requests into one batch."""

import numpy as np
import pytest
import torch

from latte.examples import CATALOG, EXAMPLES
from latte.examples.models import Ranker, SequenceEncoder


@pytest.mark.parametrize("module_type, width", [(SequenceEncoder, 32), (Ranker, 16)])
def test_padding_does_not_change_the_result(module_type, width):
    torch.manual_seed(3)
    module = module_type().eval()
    history = torch.randint(1, 1000, (1, 9))
    padded = torch.zeros((1, 40), dtype=torch.int64)
    padded[0, :9] = history[0]
    with torch.inference_mode():
        alone = module(history)
        in_batch = module(torch.cat([padded, torch.randint(1, 1000, (1, 40))]))[:1]
    assert alone.shape[-1] == width
    torch.testing.assert_close(in_batch, alone, rtol=1e-4, atol=1e-5)


def test_benchmark_examples_stay_out_of_the_bundled_set():
    assert "ranker" in CATALOG and "ranker" not in EXAMPLES
    ranker = CATALOG["ranker"]
    assert ranker.inputs[0].ragged and ranker.max_sequence_length == 64
    sample = ranker.sample(3, np.random.default_rng(0))
    assert sample["history"].shape[0] == 3 and 1 <= sample["history"].shape[1] <= 64


def test_the_example_pipeline_spec_comes_from_the_command_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "latte.cli", "examples", str(tmp_path / "p"), "--pipeline"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    spec = tmp_path / "p" / "pipeline.yaml"
    assert spec.is_file() and f"latte generate {spec} -o REPO" in done.stdout
    assert (tmp_path / "p" / "sequence" / "model.onnx").is_file()
