"""Pre-process step: text -> token ids for the `sequence` example, as a Triton python model.

Words are hashed into the encoder's vocabulary (ids 1..999; 0 is padding), so the
step needs no vocabulary file. Rows of one batch are padded with 0 to the longest.
"""

import zlib

import numpy as np

VOCAB = 1000
MAX_TOKENS = 128


def token_ids(text: bytes) -> np.ndarray:
    words = text.decode("utf-8", errors="replace").lower().split()[:MAX_TOKENS] or ["<empty>"]
    return np.array([1 + zlib.crc32(w.encode()) % (VOCAB - 1) for w in words], dtype=np.int64)


def tokenize(texts: np.ndarray) -> np.ndarray:
    """[batch, 1] texts (bytes) -> [batch, longest] int64 ids, 0-padded."""
    rows = [token_ids(t) for t in texts.reshape(-1)]
    out = np.zeros((len(rows), max(len(r) for r in rows)), dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


class TritonPythonModel:
    def execute(self, requests):
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOKENS", tokenize(texts))]))
        return responses
