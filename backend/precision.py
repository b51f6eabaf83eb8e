"""Reduced-precision variants of a model, admitted only after an accuracy check at load.

    parameters { key: "precision" value: { string_value: "int8" } }            # fp32 | int8 | fp16
    parameters { key: "accuracy_tolerance" value: { string_value: "0.02" } }   # max relative L2 error

int8: onnxruntime's dynamic quantization of an ONNX model (weights int8, activations
quantized on the fly); a CPU speed-up for matmul-heavy models. fp16: torch models on a
GPU instance. Before serving, the reduced model and the FP32 model run the same inputs
(the warmup shapes, random values); the relative L2 error, max absolute error and, for
2-d outputs, top-1 agreement are logged, and the model refuses to load when the error
exceeds the tolerance, so quantization never loses accuracy silently. Which precision a
model asks for, and whether its runtime and device offer it, is checked with the rest of
its config (backend/config.py).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

from latte.backend.config import ConfigError, ModelSpec
from latte.backend.samples import sample_values


@dataclass
class AccuracyReport:
    precision: str
    relative_l2: float
    max_abs: float
    top1_agreement: float  # NaN when outputs are not class scores

    def text(self) -> str:
        top1 = "" if np.isnan(self.top1_agreement) else f", top-1 agreement {self.top1_agreement:.1%}"
        return f"{self.precision} vs fp32: relative L2 error {self.relative_l2:.2e}, max |diff| {self.max_abs:.2e}{top1}"


def quantize_onnx_int8(path: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Outside the model repository, which may be read-only (object storage, a mounted volume).
    out = Path(tempfile.mkdtemp(prefix="latte-int8-")) / (Path(path).stem + ".int8.onnx")
    quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
    return out


def random_feeds(spec: ModelSpec, shapes: List[Dict[str, tuple]], seed: int = 0) -> List[Dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    feeds = []
    for shape_set in shapes:
        feed = {}
        for t in spec.signature.inputs:
            if t.name not in shape_set:
                continue
            feed[t.name] = sample_values(t.dtype, shape_set[t.name], rng)
        feeds.append(feed)
    return feeds


def compare(precision: str, reference: Callable, reduced: Callable, feeds) -> AccuracyReport:
    num = den = max_abs = 0.0
    agree = total = 0
    for feed in feeds:
        ref, red = reference(feed), reduced(feed)
        for name, a in ref.items():
            a = np.asarray(a, np.float64)
            b = np.asarray(red[name], np.float64)
            num += float(np.sum((a - b) ** 2))
            den += float(np.sum(a ** 2))
            max_abs = max(max_abs, float(np.max(np.abs(a - b))) if a.size else 0.0)
            if a.ndim == 2 and a.shape[1] > 1:
                agree += int(np.sum(a.argmax(1) == b.argmax(1)))
                total += a.shape[0]
    rel = (num / den) ** 0.5 if den > 0 else 0.0
    return AccuracyReport(precision, rel, max_abs, agree / total if total else float("nan"))


def load_at_precision(spec: ModelSpec, shapes: List[Dict[str, tuple]]):
    """The runtime to serve with, and the accuracy report when it is not FP32."""
    from latte.backend.runtimes import load_runtime

    signature, serving = spec.signature, spec.serving
    inputs, outputs = [t.name for t in signature.inputs], [t.name for t in signature.outputs]

    def load(path, **kwargs):
        return load_runtime(signature.runtime, path, inputs, outputs, serving.intra_op_threads,
                            serving.inter_op_threads, serving.device, freeze=serving.freeze, **kwargs)

    reference = load(signature.model_path)
    if serving.precision == "fp32":
        return reference, None
    reduced = (load(quantize_onnx_int8(signature.model_path)) if serving.precision == "int8"
               else load(signature.model_path, half=True))
    report = compare(serving.precision, reference.run, reduced.run, random_feeds(spec, shapes))
    reference.close()
    if not report.relative_l2 <= serving.accuracy_tolerance:
        raise ConfigError(f"model {signature.name!r}: {report.text()} exceeds accuracy_tolerance="
                          f"{serving.accuracy_tolerance:g}; serve it at fp32 or raise the tolerance deliberately")
    return reduced, report
