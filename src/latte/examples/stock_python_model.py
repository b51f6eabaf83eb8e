"""What a Triton user runs today, the baseline of `latte demo` and benchmarks/serving.py:
Triton's stock Python backend serving a model file the way its documentation shows, one
request at a time inside `execute`: an ONNX file with onnxruntime, or a TorchScript file
(model.pt) with torch on the instance's device (a KIND_GPU instance runs it on its GPU).

Its thread budget is set explicitly (1 intra-op thread) so that the comparison measures
batching, not thread oversubscription.
"""

import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]
        if os.path.exists(os.path.join(folder, "model.pt")):
            self.run = self._torchscript(os.path.join(folder, "model.pt"), args)
        else:
            self.run = self._onnx(os.path.join(folder, "model.onnx"))

    def _onnx(self, model_file):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(model_file, sess_options=options, providers=["CPUExecutionProvider"])
        return lambda x: session.run([self.output_name], {self.input_name: x})[0]

    def _torchscript(self, model_file, args):
        import torch

        torch.set_num_threads(1)
        on_gpu = args.get("model_instance_kind") == "GPU"
        device = torch.device(f"cuda:{args['model_instance_device_id']}" if on_gpu else "cpu")
        module = torch.jit.load(model_file, map_location=device).eval()

        def run(x):
            with torch.inference_mode():
                return module(torch.from_numpy(x).to(device)).cpu().numpy()
        return run

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
            out = self.run(x)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(self.output_name, out)]))
        return responses
