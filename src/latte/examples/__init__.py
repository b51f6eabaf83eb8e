"""Example models built locally (no downloads) and a repository serving them.

`build_examples(DIR)` trains nothing: it seeds, builds three small networks, exports
each as TorchScript and ONNX, and renders a model repository with backend "latte".
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

SEED = 20261121


@dataclass(frozen=True)
class ExampleTensor:
    name: str
    data_type: str               # Triton type, e.g. TYPE_FP32
    dims: Tuple[int, ...]        # without the batch dimension
    ragged: bool = False


@dataclass(frozen=True)
class Example:
    name: str
    description: str
    inputs: Tuple[ExampleTensor, ...]
    outputs: Tuple[ExampleTensor, ...]
    max_batch_size: int
    max_sequence_length: int = 0
    vocabulary: int = 0          # integer inputs are ids below this (declared as the valid range)

    def sample(self, rows: int, rng: np.random.Generator, length: int = 0) -> Dict[str, np.ndarray]:
        """Inputs for one request of `rows` rows (sequence length `length`, or random)."""
        feed = {}
        for t in self.inputs:
            if t.data_type == "TYPE_INT64":
                n = length or int(rng.integers(1, self.max_sequence_length + 1))
                feed[t.name] = rng.integers(1, 1000, size=(rows, n), dtype=np.int64)
            else:
                feed[t.name] = rng.standard_normal((rows, *t.dims)).astype(np.float32)
        return feed


EXAMPLES: Dict[str, Example] = {
    "mlp": Example(
        "mlp", "16 features -> 8 class logits (MLP)",
        (ExampleTensor("features", "TYPE_FP32", (16,)),), (ExampleTensor("logits", "TYPE_FP32", (8,)),),
        max_batch_size=64,
    ),
    "cnn": Example(
        "cnn", "3x32x32 image -> 10 class logits (small CNN)",
        (ExampleTensor("image", "TYPE_FP32", (3, 32, 32)),), (ExampleTensor("logits", "TYPE_FP32", (10,)),),
        max_batch_size=32,
    ),
    "sequence": Example(
        "sequence", "token ids of length 1..128 -> pooled 32-d embedding (attention encoder)",
        (ExampleTensor("tokens", "TYPE_INT64", (-1,), ragged=True),),
        (ExampleTensor("embedding", "TYPE_FP32", (32,)),),
        max_batch_size=32, max_sequence_length=128, vocabulary=1000,
    ),
}
# Built on request only (`build_examples(repo, ["ranker"])`): too large for the demo and the tests.
BENCHMARK_EXAMPLES: Dict[str, Example] = {
    "ranker": Example(
        "ranker", "item ids of length 1..64 -> 16 candidate scores (embedding bag + 4096-wide MLP tower)",
        (ExampleTensor("history", "TYPE_INT64", (-1,), ragged=True),),
        (ExampleTensor("scores", "TYPE_FP32", (16,)),),
        max_batch_size=64, max_sequence_length=64, vocabulary=50_000,
    ),
}
# Models of the example pipelines (latte.examples.pipeline) besides the bundled ones.
PIPELINE_EXAMPLES: Dict[str, Example] = {
    "topics": Example(
        "topics", "pooled 32-d text embedding -> 4 topic logits (the branching pipeline's second head)",
        (ExampleTensor("embedding", "TYPE_FP32", (32,)),), (ExampleTensor("topics", "TYPE_FP32", (4,)),),
        max_batch_size=64,
    ),
}
CATALOG: Dict[str, Example] = {**EXAMPLES, **BENCHMARK_EXAMPLES, **PIPELINE_EXAMPLES}
# The model.py of Triton's stock Python backend that latte is measured against.
STOCK_PYTHON_MODEL = Path(__file__).with_name("stock_python_model.py")
FORMATS = {"torchscript": "model.pt", "onnx": "model.onnx"}


def _module(name: str):
    from latte.examples import models

    return {"mlp": models.MLP, "cnn": models.SmallCNN, "sequence": models.SequenceEncoder,
            "ranker": models.Ranker, "topics": models.TopicHead}[name]()


def export(example: Example, out_dir: Path) -> Dict[str, Path]:
    """Export one example as TorchScript and ONNX into out_dir; returns format -> file."""
    import torch

    torch.manual_seed(SEED)
    module = _module(example.name).eval()
    rng = np.random.default_rng(SEED)
    sample = {k: torch.from_numpy(v) for k, v in example.sample(2, rng, length=7 if example.max_sequence_length else 0).items()}
    args = tuple(sample[t.name] for t in example.inputs)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, args)
        files["torchscript"] = out_dir / FORMATS["torchscript"]
        traced.save(str(files["torchscript"]))
        dynamic = {t.name: {0: "batch", **({1: "length"} if t.ragged else {})} for t in example.inputs}
        dynamic.update({t.name: {0: "batch"} for t in example.outputs})
        files["onnx"] = out_dir / FORMATS["onnx"]
        # The TorchScript-based exporter handles these graphs offline and in well under a second.
        torch.onnx.export(module, args, str(files["onnx"]), input_names=[t.name for t in example.inputs],
                          output_names=[t.name for t in example.outputs], dynamic_axes=dynamic,
                          opset_version=17, dynamo=False)
    return files


def model_context(example: Example, runtime: str, model_file: str) -> dict:
    """What the latte model template needs to render this example's config.pbtxt."""
    return {
        "name": f"{example.name}_{runtime}",
        "backend": "latte",
        "max_batch_size": example.max_batch_size,
        "inputs": [{"name": t.name, "data_type": t.data_type, "dims": list(t.dims), "allow_ragged_batch": t.ragged}
                   for t in example.inputs],
        "outputs": [{"name": t.name, "data_type": t.data_type, "dims": list(t.dims)} for t in example.outputs],
        "dynamic_batching": {"max_queue_delay_microseconds": 500},
        "instance_groups": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {
            "model_file": model_file,
            "runtime": runtime,
            "intra_op_threads": "1",
            "inter_op_threads": "1",
            **({f"valid_range:{example.inputs[0].name}": f"0..{example.vocabulary - 1}"} if example.vocabulary else {}),
            **({"max_sequence_length": str(example.max_sequence_length), "pad_value": "0",
                # Requests that carry a session_id continue that session's token prefix.
                "session_input": example.inputs[0].name, "session_ttl_s": "300"}
               if example.max_sequence_length else {}),
        },
    }


def write_served_copy(repo: Path, example: Example, source: Path, name: str, backend: str,
                      parameters: Optional[Mapping[str, str]] = None, script: Optional[Path] = None,
                      **config) -> Path:
    """`example`'s model file `source` in `repo` as NAME, served by latte (backend "latte", its
    parameters updated with `parameters`) or by Triton's stock Python backend (backend "python",
    `script` or STOCK_PYTHON_MODEL as its model.py, no parameters); `config` replaces fields of
    its config (max_batch_size, dynamic_batching, instance_groups, outputs). Returns its folder."""
    from latte.generator.model_folder import write_model

    runtime = next(r for r, file in FORMATS.items() if file == source.name)
    context = model_context(example, runtime, source.name)
    context.update(name=name, backend=backend, **config)
    context["parameters"] = {} if backend == "python" else {**context["parameters"], **(parameters or {})}
    model_dir = write_model(repo, context, {source.name: source})
    if backend == "python":
        shutil.copy(script or STOCK_PYTHON_MODEL, model_dir / "1" / "model.py")
    return model_dir


def build_examples(repo: Path, names: List[str] = None) -> Path:
    """Write the example repository (by default 6 models: the 3 bundled networks x
    {torchscript, onnx}) into repo; `names` may also pick BENCHMARK_EXAMPLES."""
    from latte.generator.model_folder import write_model

    repo = Path(repo)
    build = repo.parent / (repo.name + "-build")
    manifest = {}
    for name in names or list(EXAMPLES):
        example = CATALOG[name]
        files = export(example, build / name)
        for runtime, path in files.items():
            context = model_context(example, runtime, path.name)
            write_model(repo, context, {path.name: path})
            manifest[context["name"]] = {"example": name, "runtime": runtime}
    (repo / "examples.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return repo


def reference_runner(repo: Path, model: str) -> Callable[[Dict[str, np.ndarray]], Dict[str, np.ndarray]]:
    """Run one repository model in-process, request by request, with its own runtime library."""
    info = json.loads((Path(repo) / "examples.json").read_text())[model]
    example = CATALOG[info["example"]]
    path = Path(repo) / model / "1" / FORMATS[info["runtime"]]
    outputs = [t.name for t in example.outputs]
    if info["runtime"] == "torchscript":
        import torch

        module = torch.jit.load(str(path)).eval()

        def run(feed):
            with torch.inference_mode():
                out = module(*[torch.from_numpy(feed[t.name]) for t in example.inputs])
            return {outputs[0]: out.numpy()}
        return run
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    return lambda feed: dict(zip(outputs, session.run(outputs, feed)))
