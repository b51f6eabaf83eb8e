"""The hand-fused baseline of benchmarks/pipelines.py: Triton's stock Python backend running a
pipeline's steps itself, in one `execute`, one request at a time, as a user would write it.

It reads the same graph.json (and step files) the fused latte model runs, calls the same step
functions and runs the same model files on the CPU on one intra-op thread (ONNX through
onnxruntime, TorchScript through torch), so the comparison measures how the steps are run, not
what they compute.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"stock_step_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _torchscript(path: Path):
    """A TorchScript step on the CPU, one intra-op thread, as the ONNX ones: arrays in, arrays out."""
    import torch

    torch.set_num_threads(1)
    module = torch.jit.load(str(path), map_location="cpu").eval()

    def run(*arrays):
        with torch.inference_mode():
            result = module(*(torch.from_numpy(np.ascontiguousarray(array)) for array in arrays))
        return [r.numpy() for r in (result if isinstance(result, (tuple, list)) else (result,))]

    return run


class TritonPythonModel:
    def initialize(self, args):
        version = Path(args["model_repository"]) / args["model_version"]
        graph = json.loads((version / "graph.json").read_text())
        self.steps = []
        for step in graph["steps"]:
            folder = version / step["folder"] / "1"
            config = step["config"]
            inputs = [t["name"] for t in config["input"]]
            outputs = [t["name"] for t in config["output"]]
            if config.get("backend") == "python":
                run = getattr(_load(folder / "model.py", step["name"]), step["function"])
            elif config["parameters"]["model_file"]["string_value"].endswith(".pt"):
                run = _torchscript(folder / config["parameters"]["model_file"]["string_value"])
            else:
                options = ort.SessionOptions()
                options.intra_op_num_threads = 1
                options.inter_op_num_threads = 1
                model_file = config["parameters"]["model_file"]["string_value"]
                session = ort.InferenceSession(str(folder / model_file), sess_options=options,
                                               providers=["CPUExecutionProvider"])
                run = (lambda s, names, outs: lambda *arrays: s.run(outs, dict(zip(names, arrays))))(
                    session, inputs, outputs)
            self.steps.append((run, [step["inputs"][n] for n in inputs], [step["outputs"][n] for n in outputs]))
        self.outputs = [t["name"] for t in graph["outputs"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            values = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
            for run, reads, writes in self.steps:
                result = run(*[values[name] for name in reads])
                if not isinstance(result, (tuple, list)):
                    result = (result,)
                values.update(zip(writes, result))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(n, values[n]) for n in self.outputs]))
        return responses
