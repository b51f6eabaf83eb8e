"""Post-process step of the example image pipeline: class logits -> the top classes and their probabilities."""

import numpy as np

TOP = 3


def classify(logits: np.ndarray):
    """[batch, classes] logits -> ([batch, TOP] probabilities, [batch, TOP] class ids), best first."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    classes = np.argsort(-probabilities, axis=1, kind="stable")[:, :TOP]
    return np.take_along_axis(probabilities, classes, axis=1).astype(np.float32), classes.astype(np.int64)


class TritonPythonModel:
    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            probabilities, classes = classify(pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PROBS", probabilities),
                                                         pb_utils.Tensor("CLASSES", classes)]))
        return responses
