"""ONNX models through onnxruntime, with an explicit thread budget."""

from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

from latte.backend.runtimes.base import Runtime, RuntimeLoadError


class OnnxRuntime(Runtime):
    kind = "onnx"

    def __init__(self, path, input_names: Sequence[str], output_names: Sequence[str],
                 intra_op_threads: int, inter_op_threads: int, device: str = "cpu") -> None:
        super().__init__(input_names, output_names)
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = inter_op_threads
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Spinning threads burn the cores other lanes and the server need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers = ["CPUExecutionProvider"]
        if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            index = int(device.split(":")[1]) if ":" in device else 0
            providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as exc:
            raise RuntimeLoadError(f"onnxruntime could not load {path}: {exc}") from exc
        graph_inputs = {i.name for i in self.session.get_inputs()}
        graph_outputs = {o.name for o in self.session.get_outputs()}
        missing_in = [n for n in input_names if n not in graph_inputs]
        missing_out = [n for n in output_names if n not in graph_outputs]
        if missing_in or missing_out:
            raise RuntimeLoadError(
                f"config and ONNX graph disagree: inputs {missing_in} / outputs {missing_out} are not in the graph "
                f"(graph inputs {sorted(graph_inputs)}, outputs {sorted(graph_outputs)})"
            )

        # The session's own binding, as InferenceSession.run calls it after re-checking the
        # feed's names on every call (~4 us of a ~8 us call on a small model); the names were
        # checked once above, against the config.
        self._binding = getattr(self.session, "_sess", None)
        self._run_options = ort.RunOptions()

    def run(self, feed: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        feed = {k: np.ascontiguousarray(v) for k, v in feed.items()}
        if self._binding is None:  # an onnxruntime without the private binding
            values = self.session.run(self.output_names, feed)
        else:
            values = self._binding.run(self.output_names, feed, self._run_options)
        return dict(zip(self.output_names, values))
