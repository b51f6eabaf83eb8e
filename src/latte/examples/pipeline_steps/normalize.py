"""Post-process step: pooled embedding -> unit-length embedding and its original norm."""

import numpy as np


def normalize(embedding: np.ndarray):
    """[batch, width] -> ([batch, width] unit vectors, [batch, 1] norms)."""
    norms = np.linalg.norm(embedding, axis=1, keepdims=True).astype(np.float32)
    return (embedding / np.maximum(norms, 1e-12)).astype(np.float32), norms


class TritonPythonModel:
    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            unit, norms = normalize(pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("EMBEDDING", unit),
                                                         pb_utils.Tensor("NORM", norms)]))
        return responses
