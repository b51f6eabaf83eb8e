"""Lay out a Triton backend directory that serves `backend: "latte"` models.

    DIR/python/libtriton_python.so            Triton's Python backend
    DIR/python/triton_python_backend_utils.py
    DIR/python/triton_python_backend_stub     the stub for this interpreter
    DIR/latte/model.py                        Latte's lifecycle entry point

Triton loads a Python-based backend by running DIR/<name>/model.py through the
Python backend found in DIR/python, the way Triton's vLLM backend is shipped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from latte.triton.locate import TritonInstall

BACKEND_NAME = "latte"
_MODEL_PY = Path(__file__).resolve().parent.parent / "backend" / "model.py"


def _copy_if_changed(src: Path, dst: Path) -> None:
    if dst.exists() and dst.stat().st_size == src.stat().st_size and dst.read_bytes() == src.read_bytes():
        return
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copy2(src, tmp)
    tmp.replace(dst)  # atomic, so a running server never sees half a file


def install_backend(dest: Path, install: TritonInstall) -> Path:
    """Create or refresh DEST so Triton can serve latte models from it; returns DEST."""
    dest = Path(dest).resolve()
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    if install.python_backend.resolve() != python_dir:
        # Copies, not links: the Python backend looks for its stub next to its own
        # shared library, which a link would resolve back to the original folder.
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            _copy_if_changed(install.python_backend / name, python_dir / name)
        _copy_if_changed(install.stub, python_dir / "triton_python_backend_stub")
    latte_dir = dest / BACKEND_NAME
    latte_dir.mkdir(parents=True, exist_ok=True)
    model_py = _MODEL_PY
    if not model_py.exists():
        raise FileNotFoundError(f"latte's backend entry point is missing from the install: {model_py}")
    _copy_if_changed(model_py, latte_dir / "model.py")
    return dest
