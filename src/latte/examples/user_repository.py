"""The text pipeline written the way Triton users write theirs, for `latte fuse` to take as it is.

Each Python model reads one row per request (its clients send one), imports a helper module
`utils.py` from beside its `model.py` by its bare name (the two models' helpers differ), and
reads a file of its own from `args["model_repository"]` in `initialize`. The encoder is
latte's sequence example and the ensemble `embed_text` chains the three steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

from latte.examples.pipeline import HAND_WRITTEN

TOKENIZE_MODEL = '''\
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from utils import Vocabulary


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.vocabulary = Vocabulary(os.path.join(folder, "vocab.txt"))

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()[0][0]
            ids = np.array([self.vocabulary.encode(text)], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("TOKENS", ids)]))
        return responses
'''

TOKENIZE_UTILS = '''\
"""Words to ids: the words of vocab.txt first, any other word hashed into the rest."""
import zlib

SIZE = 1000


class Vocabulary:
    def __init__(self, path):
        with open(path) as f:
            self.ids = {word.strip(): i + 1 for i, word in enumerate(f) if word.strip()}

    def encode(self, text):
        words = text.decode("utf-8", errors="replace").lower().split()[:128] or ["<empty>"]
        return [self.ids.get(w) or 1 + zlib.crc32(w.encode()) % (SIZE - 1) for w in words]
'''

NORMALIZE_MODEL = '''\
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from utils import scale


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(args["model_repository"], args["model_version"], "settings.json")) as f:
            self.epsilon = json.load(f)["epsilon"]

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()[0]
            unit, norm = scale(raw, self.epsilon)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("EMBEDDING", unit[None].astype(np.float32)),
                pb_utils.Tensor("NORM", np.array([[norm]], dtype=np.float32))]))
        return responses
'''

NORMALIZE_UTILS = '''\
"""Unit-length vectors."""
import numpy as np


def scale(vector, epsilon):
    norm = float(np.linalg.norm(vector))
    return vector / max(norm, epsilon), norm
'''

VOCABULARY = "the\nquick\nbrown\nfox\nlatte\nserves\n"


def write_user_repository(repo: Path) -> Path:
    """REPO/{tokenize, encoder, normalize, embed_text}: the text pipeline as users write it."""
    from latte.examples import EXAMPLES, export

    repo = Path(repo)
    files = export(EXAMPLES["sequence"], repo.parent / f"{repo.name}-build")
    python_files: Dict[str, Dict[str, str]] = {
        "tokenize": {"model.py": TOKENIZE_MODEL, "utils.py": TOKENIZE_UTILS, "vocab.txt": VOCABULARY},
        "normalize": {"model.py": NORMALIZE_MODEL, "utils.py": NORMALIZE_UTILS,
                      "settings.json": '{"epsilon": 1e-12}\n'},
    }
    for model, config in (("tokenize", "tokenize"), ("encoder", "encoder_latte"), ("normalize", "normalize"),
                          ("embed_text", "embed_text")):
        version = repo / model / "1"
        version.mkdir(parents=True, exist_ok=True)
        (repo / model / "config.pbtxt").write_text(HAND_WRITTEN[config])
        for name, text in python_files.get(model, {}).items():
            (version / name).write_text(text)
    (repo / "encoder" / "1" / "model.onnx").write_bytes(Path(files["onnx"]).read_bytes())
    return repo
