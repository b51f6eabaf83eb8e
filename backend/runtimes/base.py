"""The interface every runtime implements, and the loader that picks one."""

from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from latte.backend.errors import RuntimeLoadError


class Runtime:
    """Runs a model on a dict of named numpy arrays and returns named outputs.

    Implementations own their thread budget: they are built with explicit intra- and
    inter-op thread counts and never fall back to the library defaults.
    """

    kind = "base"

    def __init__(self, input_names: Sequence[str], output_names: Sequence[str]) -> None:
        self.input_names: List[str] = list(input_names)
        self.output_names: List[str] = list(output_names)

    def run(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def load_runtime(kind: str, path, input_names: Sequence[str], output_names: Sequence[str],
                 intra_op_threads: int, inter_op_threads: int, device: str = "cpu", half: bool = False) -> Runtime:
    if kind in ("torchscript", "torch_export"):
        from latte.backend.runtimes.torch_runtime import TorchRuntime

        return TorchRuntime(kind, path, input_names, output_names, intra_op_threads, inter_op_threads, device, half)
    if half:
        raise RuntimeLoadError(f"half precision is available for torch models, not {kind}")
    if kind == "onnx":
        from latte.backend.runtimes.onnx_runtime import OnnxRuntime

        return OnnxRuntime(path, input_names, output_names, intra_op_threads, inter_op_threads, device)
    if kind == "tensorrt":
        from latte.backend.runtimes.tensorrt_runtime import TensorRTRuntime

        return TensorRTRuntime(path, input_names, output_names, device)
    raise RuntimeLoadError(f"unknown runtime {kind!r}")
