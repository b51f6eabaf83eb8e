"""Triton's entry point for `backend: "latte"` models: the lifecycle, nothing else.

Installed as <backend-directory>/latte/model.py by `latte install-backend`; the work
is done by latte.backend.triton_model.LatteModel, or for a decoupled model (one that streams)
by latte.backend.streaming.model.StreamingModel.
"""

import json

import triton_python_backend_utils as pb_utils

from latte.backend.streaming.model import StreamingModel, is_decoupled
from latte.backend.triton_model import LatteModel


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        return LatteModel.auto_complete_config(auto_complete_model_config, pb_utils)

    def initialize(self, args):
        streaming = is_decoupled(json.loads(args["model_config"]))
        self._model = (StreamingModel if streaming else LatteModel)(args, pb_utils)

    def execute(self, requests):
        return self._model.execute(requests)

    def finalize(self):
        self._model.finalize()
