"""The one-hop floor of benchmarks/pipelines.py: Triton's stock Python backend with a pipeline's
inputs and outputs that computes nothing (zeros of each declared output, one row per input row)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.outputs = [(t["name"], pb_utils.triton_string_to_numpy(t["data_type"]), [int(d) for d in t["dims"]])
                        for t in config["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            rows = request.inputs()[0].as_numpy().shape[0]
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, np.zeros((rows, *dims), dtype=dtype)) for name, dtype, dims in self.outputs]))
        return responses
