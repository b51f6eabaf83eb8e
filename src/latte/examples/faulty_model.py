"""A Python model that misbehaves on purpose, written as Triton's Python backend documents a
model.py: one response per request, in `execute`.

It answers Y = X * 2 for each request's X (INT64, one value a row), except:

    X == -1   its process crashes as a null-pointer dereference does (a real SIGSEGV)
    X == -2   the call hangs (it sleeps for an hour)

and a file named `crash_at_load` in its version folder crashes it in `initialize`, so that a
model restarted after a crash crashes again as it loads.

latte.examples.fault_models serves this same file with Triton's Python backend and with latte
(the one Python step of a graph).
"""

import ctypes
import os
import time

import triton_python_backend_utils as pb_utils

CRASH = -1
HANG = -2
CRASH_AT_LOAD = "crash_at_load"


def _null_pointer_dereference():
    ctypes.string_at(0)


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        if os.path.exists(os.path.join(folder, CRASH_AT_LOAD)):
            _null_pointer_dereference()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x == CRASH).any():
                _null_pointer_dereference()
            if (x == HANG).any():
                time.sleep(3600)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x * 2)]))
        return responses
