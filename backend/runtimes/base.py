"""The interface every runtime implements, and the loader that picks one."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from latte.backend.errors import RuntimeLoadError


class Runtime:
    """Runs a model on a dict of named numpy arrays and returns named outputs.

    Implementations own their thread budget: they are built with explicit intra- and
    inter-op thread counts and never fall back to the library defaults.
    """

    kind = "base"
    device = "cpu"  # where it computes (a torch runtime's torch.device)
    takes_tensors = False  # whether run_tensors takes and gives torch tensors on the runtime's device

    def __init__(self, input_names: Sequence[str], output_names: Sequence[str]) -> None:
        self.input_names: List[str] = list(input_names)
        self.output_names: List[str] = list(output_names)
        self.notes: List[str] = []  # what the server log should say about how the model runs

    def run(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        raise NotImplementedError

    def run_batch(self, batch) -> Tuple[Dict[str, np.ndarray], Optional[Dict[str, Sequence[int]]]]:
        """Run one planned batch (batching.Batch): the contract a model step and a graph of
        steps share. Gives the outputs and each row's own length of the ragged outputs whose
        rows it knows to differ (a graph's, as Batch.lengths says a row's length); a model's
        is None: every output row is its full width, or cut back by the config's declared
        dims (batching.split)."""
        return self.run(batch.inputs), None

    def samples(self) -> Optional[List[Dict[str, np.ndarray]]]:
        """Requests (one row each) the model is known to accept, to warm up with; None: made-up
        ones do (a graph whose first step parses what it is sent has its own)."""
        return None

    def close(self) -> None:
        pass


def load_runtime(kind: str, path, input_names: Sequence[str], output_names: Sequence[str],
                 intra_op_threads: int, inter_op_threads: int, device: str = "cpu", half: bool = False,
                 freeze: bool = True) -> Runtime:
    """The runtime of `kind` for the model at `path`; for a graph, the graph of its steps (which
    answers the same run_batch, samples and close)."""
    if kind == "graph":
        if half:
            raise RuntimeLoadError("a graph of steps runs each step at its own precision; set precision per step")
        from latte.backend.graph.graph import Graph

        return Graph(path, input_names, output_names, intra_op_threads, inter_op_threads, device, freeze)
    if kind in ("torchscript", "torch_export"):
        from latte.backend.runtimes.torch_runtime import TorchRuntime

        return TorchRuntime(kind, path, input_names, output_names, intra_op_threads, inter_op_threads, device, half,
                            freeze)
    if half:
        raise RuntimeLoadError(f"half precision is available for torch models, not {kind}")
    if kind == "onnx":
        from latte.backend.runtimes.onnx_runtime import OnnxRuntime

        return OnnxRuntime(path, input_names, output_names, intra_op_threads, inter_op_threads, device)
    if kind == "tensorrt":
        from latte.backend.runtimes.tensorrt_runtime import TensorRTRuntime

        return TensorRTRuntime(path, input_names, output_names, device)
    raise RuntimeLoadError(f"unknown runtime {kind!r}")
