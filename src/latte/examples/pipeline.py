"""The example text pipeline: tokenize (python) -> sequence encoder (latte) -> normalize (python).

`write_pipeline(DIR)` exports the `sequence` example, copies the two python steps and
writes DIR/pipeline.yaml, ready for `latte generate DIR/pipeline.yaml -o REPO`.
`run_in_process` is the same pipeline without Triton, to check served outputs against.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Dict, Optional

import numpy as np

STEPS = Path(__file__).resolve().parent / "pipeline_steps"

SPEC = """\
resources: {{cores: {cores}}}
models:
  - name: tokenize
    file: tokenize.py
    function: tokenize
    max_batch_size: 32
    inputs:  [{{name: TEXT, data_type: TYPE_STRING, dims: [1]}}]
    outputs: [{{name: TOKENS, data_type: TYPE_INT64, dims: [-1]}}]
  - name: encoder
    file: sequence/model.onnx
    slo_ms: {slo_ms}
{profile_line}  - name: normalize
    file: normalize.py
    function: normalize
    max_batch_size: 32
    inputs:  [{{name: RAW, data_type: TYPE_FP32, dims: [32]}}]
    outputs:
      - {{name: EMBEDDING, data_type: TYPE_FP32, dims: [32]}}
      - {{name: NORM, data_type: TYPE_FP32, dims: [1]}}
ensembles:
  - name: embed_text
    inputs:  [{{name: TEXT, data_type: TYPE_STRING, dims: [1]}}]
    outputs:
      - {{name: EMBEDDING, data_type: TYPE_FP32, dims: [32]}}
      - {{name: NORM, data_type: TYPE_FP32, dims: [1]}}
    steps:
      - {{model: tokenize, inputs: {{TEXT: TEXT}}, outputs: {{TOKENS: tokens}}}}
      - {{model: encoder, inputs: {{tokens: tokens}}, outputs: {{embedding: raw_embedding}}}}
      - {{model: normalize, inputs: {{RAW: raw_embedding}}, outputs: {{EMBEDDING: EMBEDDING, NORM: NORM}}}}
"""


def _load_step(name: str):
    spec = importlib.util.spec_from_file_location(f"latte_pipeline_{name}", STEPS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_pipeline(directory: Path, slo_ms: float = 50.0, cores: int = 2, profile: Optional[Path] = None,
                   export_model: bool = True) -> Path:
    """Lay out the example pipeline's files and spec in directory; returns the spec path."""
    from latte.examples import EXAMPLES, export

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if export_model:
        export(EXAMPLES["sequence"], directory / "sequence")
    for name in ("tokenize", "normalize"):
        shutil.copy2(STEPS / f"{name}.py", directory / f"{name}.py")
    profile_line = f"    profile: {profile}\n" if profile else ""
    spec = directory / "pipeline.yaml"
    spec.write_text(SPEC.format(cores=cores, slo_ms=slo_ms, profile_line=profile_line))
    return spec


def run_in_process(directory: Path, texts: np.ndarray) -> Dict[str, np.ndarray]:
    """The pipeline on [batch, 1] texts without Triton: same steps, same ONNX model."""
    import onnxruntime as ort

    tokenize, normalize = _load_step("tokenize"), _load_step("normalize")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(Path(directory) / "sequence" / "model.onnx"), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    raw = session.run(["embedding"], {"tokens": tokenize.tokenize(texts)})[0]
    unit, norms = normalize.normalize(raw)
    return {"EMBEDDING": unit, "NORM": norms}
