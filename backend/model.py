"""Triton's entry point for `backend: "latte"` models: the lifecycle, nothing else.

Installed as <backend-directory>/latte/model.py by `latte install-backend`; the work
is done by latte.backend.triton_model.LatteModel.
"""

import triton_python_backend_utils as pb_utils

from latte.backend.triton_model import LatteModel


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        return LatteModel.auto_complete_config(auto_complete_model_config, pb_utils)

    def initialize(self, args):
        self._model = LatteModel(args, pb_utils)

    def execute(self, requests):
        return self._model.execute(requests)

    def finalize(self):
        self._model.finalize()
