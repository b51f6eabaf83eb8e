"""The serving-cost baseline of benchmarks/serving.py: Triton's stock Python backend with a
model.py that returns its input, the least work any Python-backend model can do per request."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, self.input_name)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(self.output_name, tensor.as_numpy())]))
        return responses
