"""Sessions' last committed turns, kept outside the model's process so that a restarted model
resumes them.

One file per session, named by a digest of its id: a JSON line (the id, the dtype, the number
of tokens) and the prefix's raw bytes, written beside and renamed over the last, so a file is
always one whole turn. A session that ends or expires has its file removed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Dict

import numpy as np


class SessionCheckpoint:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _file(self, session_id: str) -> Path:
        return self.folder / hashlib.blake2b(session_id.encode(), digest_size=12).hexdigest()

    def save(self, session_id: str, prefix: np.ndarray) -> None:
        prefix = np.ascontiguousarray(prefix)
        head = json.dumps({"id": session_id, "dtype": str(prefix.dtype), "length": int(prefix.shape[0])})
        target = self._file(session_id)
        beside = target.with_suffix(f".{os.getpid()}.tmp")
        with open(beside, "wb") as f:
            f.write(head.encode() + b"\n")
            f.write(prefix.tobytes())
        os.replace(beside, target)

    def drop(self, session_id: str) -> None:
        try:
            self._file(session_id).unlink()
        except FileNotFoundError:
            pass

    def load(self) -> Dict[str, np.ndarray]:
        """Every session kept, by id; a file that cannot be read is skipped (and removed)."""
        sessions = {}
        for path in self.folder.iterdir():
            if path.suffix == ".tmp":
                continue
            try:
                raw = path.read_bytes()
                head, body = raw.split(b"\n", 1)
                meta = json.loads(head)
                prefix = np.frombuffer(body, dtype=np.dtype(meta["dtype"])).copy()
                if prefix.shape[0] != int(meta["length"]):
                    raise ValueError("length")
                sessions[str(meta["id"])] = prefix
            except (ValueError, KeyError, TypeError, OSError):
                path.unlink(missing_ok=True)
        return sessions
