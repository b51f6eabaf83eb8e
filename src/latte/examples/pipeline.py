"""The example pipelines, each a spec for `latte generate` with its files, requests to send and
the same steps run without Triton to check served outputs against.

- text (ensemble `embed_text`): tokenize (python) -> sequence encoder (ONNX) -> normalize (python)
- image (ensemble `classify_image`): decode PPM bytes, resize, scale (python) -> the CNN (ONNX)
  -> softmax and top-3 (python)
- branching (ensemble `embed_and_tag`): tokenize -> encoder, whose output feeds two heads:
  normalize (python) and a topic classifier (ONNX)

`write_pipeline(DIR, name)` exports the models, copies the python steps and writes
DIR/pipeline.yaml, ready for `latte generate DIR/pipeline.yaml -o REPO`; the python steps name
their batch functions (`function:`), so a fused model calls them once per batch.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

STEPS = Path(__file__).resolve().parent / "pipeline_steps"

TEXT_MODELS = """\
  - name: tokenize
    file: tokenize.py
    function: tokenize
    max_batch_size: 32
    inputs:  [{{name: TEXT, data_type: TYPE_STRING, dims: [1]}}]
    outputs: [{{name: TOKENS, data_type: TYPE_INT64, dims: [-1]}}]
  - name: encoder
    file: sequence/{model_file}
{interface_encoder}    slo_ms: {slo_ms}
{profile_encoder}  - name: normalize
    file: normalize.py
    function: normalize
    max_batch_size: 32
    inputs:  [{{name: RAW, data_type: TYPE_FP32, dims: [32]}}]
    outputs:
      - {{name: EMBEDDING, data_type: TYPE_FP32, dims: [32]}}
      - {{name: NORM, data_type: TYPE_FP32, dims: [1]}}
"""

TEXT = """\
resources: {{cores: {cores}, gpus: {gpus}}}
models:
""" + TEXT_MODELS + """\
ensembles:
  - name: embed_text
    samples: samples.json
{profile_embed_text}    inputs:  [{{name: TEXT, data_type: TYPE_STRING, dims: [1]}}]
    outputs:
      - {{name: EMBEDDING, data_type: TYPE_FP32, dims: [32]}}
      - {{name: NORM, data_type: TYPE_FP32, dims: [1]}}
    steps:
      - {{model: tokenize, inputs: {{TEXT: TEXT}}, outputs: {{TOKENS: tokens}}}}
      - {{model: encoder, inputs: {{tokens: tokens}}, outputs: {{embedding: raw_embedding}}}}
      - {{model: normalize, inputs: {{RAW: raw_embedding}}, outputs: {{EMBEDDING: EMBEDDING, NORM: NORM}}}}
"""

BRANCHING = """\
resources: {{cores: {cores}, gpus: {gpus}}}
models:
""" + TEXT_MODELS + """\
  - name: topics
    file: topics/{model_file}
{interface_topics}    slo_ms: {slo_ms}
{profile_topics}ensembles:
  - name: embed_and_tag
    samples: samples.json
{profile_embed_and_tag}    inputs:  [{{name: TEXT, data_type: TYPE_STRING, dims: [1]}}]
    outputs:
      - {{name: EMBEDDING, data_type: TYPE_FP32, dims: [32]}}
      - {{name: NORM, data_type: TYPE_FP32, dims: [1]}}
      - {{name: TOPICS, data_type: TYPE_FP32, dims: [4]}}
    steps:
      - {{model: tokenize, inputs: {{TEXT: TEXT}}, outputs: {{TOKENS: tokens}}}}
      - {{model: encoder, inputs: {{tokens: tokens}}, outputs: {{embedding: raw_embedding}}}}
      - {{model: normalize, inputs: {{RAW: raw_embedding}}, outputs: {{EMBEDDING: EMBEDDING, NORM: NORM}}}}
      - {{model: topics, inputs: {{embedding: raw_embedding}}, outputs: {{topics: TOPICS}}}}
"""

IMAGE = """\
resources: {{cores: {cores}, gpus: {gpus}}}
models:
  - name: decode
    file: decode.py
    function: decode
    max_batch_size: 32
    inputs:  [{{name: IMAGE, data_type: TYPE_STRING, dims: [1]}}]
    outputs: [{{name: PIXELS, data_type: TYPE_FP32, dims: [3, 32, 32]}}]
  - name: cnn
    file: cnn/{model_file}
{interface_cnn}    slo_ms: {slo_ms}
{profile_cnn}  - name: classify
    file: classify.py
    function: classify
    max_batch_size: 32
    inputs:  [{{name: LOGITS, data_type: TYPE_FP32, dims: [10]}}]
    outputs:
      - {{name: PROBS, data_type: TYPE_FP32, dims: [3]}}
      - {{name: CLASSES, data_type: TYPE_INT64, dims: [3]}}
ensembles:
  - name: classify_image
    samples: samples.json
{profile_classify_image}    inputs:  [{{name: IMAGE, data_type: TYPE_STRING, dims: [1]}}]
    outputs:
      - {{name: PROBS, data_type: TYPE_FP32, dims: [3]}}
      - {{name: CLASSES, data_type: TYPE_INT64, dims: [3]}}
    steps:
      - {{model: decode, inputs: {{IMAGE: IMAGE}}, outputs: {{PIXELS: pixels}}}}
      - {{model: cnn, inputs: {{image: pixels}}, outputs: {{logits: logits}}}}
      - {{model: classify, inputs: {{LOGITS: logits}}, outputs: {{PROBS: PROBS, CLASSES: CLASSES}}}}
"""

# Requests of each example pipeline's samples.json (generate keeps a few to check with at load and
# profiles the fused model on all of them).
SAMPLES = 16
# Word counts of the example texts: lognormal, median 24 (as the sequence encoder's benchmarks).
WORDS_MEDIAN, WORDS_SIGMA, MAX_WORDS = 24, 0.8, 128


def ppm(rgb: np.ndarray) -> bytes:
    """[height, width, 3] uint8 pixels as a binary PPM file."""
    height, width, _ = rgb.shape
    return f"P6\n{width} {height}\n255\n".encode() + np.ascontiguousarray(rgb, dtype=np.uint8).tobytes()


def random_texts(count: int, rng: np.random.Generator) -> List[bytes]:
    words = np.clip(rng.lognormal(np.log(WORDS_MEDIAN), WORDS_SIGMA, size=count).round(), 1, MAX_WORDS)
    return [" ".join(f"w{v}" for v in rng.integers(0, 5000, size=int(n))).encode() for n in words]


def random_images(count: int, rng: np.random.Generator) -> List[bytes]:
    sizes = rng.integers(24, 97, size=(count, 2))
    return [ppm(rng.integers(0, 256, size=(int(h), int(w), 3), dtype=np.uint8)) for h, w in sizes]


@dataclass(frozen=True)
class PipelineExample:
    name: str
    ensemble: str                        # the name clients call
    description: str
    spec: str                            # pipeline.yaml, formatted with cores, slo_ms and profile lines
    steps: Tuple[str, ...]               # python step files copied next to the spec
    models: Tuple[Tuple[str, str], ...]  # (spec model, example model exported into a folder of that name)
    input_name: str
    make_inputs: Callable[[int, np.random.Generator], List[bytes]]

    def requests(self, count: int, seed: int = 7) -> List[Dict[str, np.ndarray]]:
        """`count` one-row requests, as clients send them: {input: [1, 1] bytes}."""
        values = self.make_inputs(count, np.random.default_rng(seed))
        return [{self.input_name: np.array([[v]], dtype=object)} for v in values]


PIPELINES: Dict[str, PipelineExample] = {
    "text": PipelineExample("text", "embed_text", "tokenize (python) -> sequence encoder (ONNX) -> normalize (python)",
                            TEXT, ("tokenize", "normalize"), (("encoder", "sequence"),), "TEXT", random_texts),
    "image": PipelineExample("image", "classify_image", "decode, resize, scale (python) -> CNN (ONNX) -> top-3 "
                             "(python)", IMAGE, ("decode", "classify"), (("cnn", "cnn"),), "IMAGE", random_images),
    "branching": PipelineExample("branching", "embed_and_tag", "tokenize -> encoder -> {normalize (python), topics "
                                 "(ONNX)}", BRANCHING, ("tokenize", "normalize"),
                                 (("encoder", "sequence"), ("topics", "topics")), "TEXT", random_texts),
}


def _load_step(name: str):
    spec = importlib.util.spec_from_file_location(f"latte_pipeline_{name}", STEPS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _interface_lines(example) -> str:
    """A spec model's inputs and outputs, as an example model declares them."""
    def tensors(found) -> str:
        return ", ".join(f"{{name: {t.name}, data_type: {t.data_type}, dims: {list(t.dims)}"
                         + (", ragged: true" if t.ragged else "") + "}" for t in found)

    return f"    inputs:  [{tensors(example.inputs)}]\n    outputs: [{tensors(example.outputs)}]\n"


def write_pipeline(directory: Path, slo_ms: float = 50.0, cores: int = 2, profile: Optional[Path] = None,
                   export_model: bool = True, name: str = "text", profiles: Optional[Dict[str, Path]] = None,
                   model_format: str = "onnx", gpus: int = 0) -> Path:
    """Lay out an example pipeline's files and spec in directory; returns the spec path.
    `profiles` maps latte models and ensembles of the spec (encoder, cnn, topics, and the fused
    embed_text, classify_image, embed_and_tag) to profiles that spare profiling them; `profile`
    is the first model's (the encoder's, or the CNN's). `model_format` names the models' files
    the spec serves (onnx, or torchscript: torch steps, which keep a GPU's intermediates on it);
    `gpus` is the spec's resources."""
    from latte.examples import CATALOG, FORMATS, export

    example = PIPELINES[name]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if export_model:
        for _, model in example.models:
            export(CATALOG[model], directory / model)
    for step in example.steps:
        shutil.copy2(STEPS / f"{step}.py", directory / f"{step}.py")
    # Requests as clients send them: the fused model checks its steps on them at load (made-up
    # bytes are no image) and is profiled on them (made-up words are shorter than these texts).
    from latte.triton.perf import write_input_data

    write_input_data(directory / "samples.json", [{k: v[0] for k, v in r.items()} for r in example.requests(SAMPLES)])
    given = dict(profiles or {})
    if profile is not None:
        given.setdefault(example.models[0][0], profile)
    lines = {f"profile_{model}": f"    profile: {given[model]}\n" if model in given else ""
             for model in ("encoder", "cnn", "topics", "embed_text", "classify_image", "embed_and_tag")}
    spec = directory / "pipeline.yaml"
    # An ONNX file says its inputs and outputs; a TorchScript file does not, so the spec does.
    for model, exported in (("encoder", "sequence"), ("topics", "topics"), ("cnn", "cnn")):
        lines[f"interface_{model}"] = _interface_lines(CATALOG[exported]) if model_format != "onnx" else ""
    spec.write_text(example.spec.format(cores=cores, gpus=gpus, slo_ms=slo_ms, model_file=FORMATS[model_format],
                                        **lines))
    return spec


class InProcess:
    """An example pipeline without Triton: the same step functions and ONNX files, one thread."""

    def __init__(self, directory: Path, name: str = "text") -> None:
        import onnxruntime as ort

        self.example = PIPELINES[name]
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.sessions = {spec_name: ort.InferenceSession(str(Path(directory) / model / "model.onnx"),
                                                         sess_options=options, providers=["CPUExecutionProvider"])
                         for spec_name, model in self.example.models}
        self.steps = {step: _load_step(step) for step in self.example.steps}

    def _onnx(self, model: str, feed: Dict[str, np.ndarray]) -> np.ndarray:
        return self.sessions[model].run(None, feed)[0]

    def __call__(self, inputs: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """One batch ([rows, 1] bytes) through the pipeline's steps."""
        steps = self.steps
        if self.example.name == "image":
            logits = self._onnx("cnn", {"image": steps["decode"].decode(inputs["IMAGE"])})
            probabilities, classes = steps["classify"].classify(logits)
            return {"PROBS": probabilities, "CLASSES": classes}
        raw = self._onnx("encoder", {"tokens": steps["tokenize"].tokenize(inputs["TEXT"])})
        unit, norms = steps["normalize"].normalize(raw)
        outputs = {"EMBEDDING": unit, "NORM": norms}
        if self.example.name == "branching":
            outputs["TOPICS"] = self._onnx("topics", {"embedding": raw})
        return outputs


def side_by_side(directory: Path, name: str = "text", slo_ms: float = 50.0, cores: int = 2,
                 log: Callable[[str], None] = lambda line: None, model_format: str = "onnx",
                 gpus: int = 0) -> Tuple[Path, Dict[str, str]]:
    """One repository serving an example pipeline twice: fused, under the ensemble's name (as
    `latte generate` renders it), and as Triton's ensemble of the same step models (as
    `latte generate --no-fuse` renders it), named <ensemble>_ensemble. Returns the repository
    and {"fused": name, "ensemble": name}."""
    import re

    from latte.generator.generate import generate
    from latte.generator.validate import validate_repository

    directory = Path(directory)
    example = PIPELINES[name]
    spec = write_pipeline(directory / "files", slo_ms=slo_ms, cores=cores, name=name, model_format=model_format,
                          gpus=gpus)
    repo, plain = directory / "repo", directory / "plain"
    generate(spec, repo, log=log)
    generate(spec, plain, fuse=False)  # the profiles and calibration the first run kept
    ensemble = f"{example.ensemble}_ensemble"
    target = repo / ensemble
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(plain / example.ensemble, target)
    config = target / "config.pbtxt"
    config.write_text(re.sub(r'^name: ".*"$', f'name: "{ensemble}"', config.read_text(), count=1, flags=re.M))
    validate_repository(repo)
    return repo, {"fused": example.ensemble, "ensemble": ensemble}


HAND_WRITTEN = {
    "tokenize": """\
name: "tokenize"
backend: "python"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TOKENS" data_type: TYPE_INT64 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
""",
    "encoder_latte": """\
name: "encoder"
backend: "latte"
max_batch_size: 8
input [ { name: "tokens" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "embedding" data_type: TYPE_FP32 dims: [ 32 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "max_sequence_length" value: { string_value: "128" } }
parameters { key: "pad_value" value: { string_value: "0" } }
""",
    "encoder_onnxruntime": """\
name: "encoder"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "tokens" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "embedding" data_type: TYPE_FP32 dims: [ 32 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 1 kind: KIND_CPU } ]
""",
    "normalize": """\
name: "normalize"
backend: "python"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 32 ] } ]
output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 32 ] }, { name: "NORM" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
""",
    "embed_text": """\
name: "embed_text"
platform: "ensemble"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 32 ] }, { name: "NORM" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "tokenize" model_version: -1 input_map { key: "TEXT" value: "TEXT" } output_map { key: "TOKENS" value: "tokens" } },
    { model_name: "encoder" model_version: -1 input_map { key: "tokens" value: "tokens" } output_map { key: "embedding" value: "raw" } },
    { model_name: "normalize" model_version: -1 input_map { key: "RAW" value: "raw" }
      output_map { key: "EMBEDDING" value: "EMBEDDING" } output_map { key: "NORM" value: "NORM" } }
  ]
}
""",
}


def write_hand_written_repository(repo: Path, encoder_backend: str = "latte") -> Path:
    """The text pipeline as a Triton user writes it by hand, without latte's generator: python
    models for tokenize and normalize (each file a TritonPythonModel), the encoder served by
    `encoder_backend` (latte or onnxruntime), and the ensemble embed_text; for `latte fuse`."""
    from latte.examples import EXAMPLES, export

    repo = Path(repo)
    files = export(EXAMPLES["sequence"], repo.parent / f"{repo.name}-build")
    for model, config, source in (("tokenize", "tokenize", STEPS / "tokenize.py"),
                                  ("encoder", f"encoder_{encoder_backend}", files["onnx"]),
                                  ("normalize", "normalize", STEPS / "normalize.py"),
                                  ("embed_text", "embed_text", None)):
        (repo / model / "1").mkdir(parents=True, exist_ok=True)
        (repo / model / "config.pbtxt").write_text(HAND_WRITTEN[config])
        if source is not None:
            shutil.copy2(source, repo / model / "1" / ("model.py" if source.suffix == ".py" else "model.onnx"))
    return repo
