"""What a Triton user runs today, the baseline of `latte demo` and benchmarks/serving.py:
Triton's stock Python backend serving an ONNX file the way its documentation shows, one
request at a time inside `execute`.

Its thread budget is set explicitly (1 intra-op thread) so that the comparison measures
batching, not thread oversubscription.
"""

import json
import os

import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        model_file = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(model_file, sess_options=options, providers=["CPUExecutionProvider"])
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
            (out,) = self.session.run([self.output_name], {self.input_name: tokens})
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(self.output_name, out)]))
        return responses
