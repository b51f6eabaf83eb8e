"""Where the tritonserver binary, the Python backend and its stub live.

Two sources are supported: the server bundled in the `nvidia-pytriton` wheel (what
`make demo` installs), and an existing install such as NGC's `/opt/tritonserver`,
named with `--tritonserver` / `--backend-directory` or the environment variables
LATTE_TRITONSERVER / LATTE_TRITON_BACKENDS.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional


class TritonNotFound(RuntimeError):
    """No usable tritonserver / Python backend was found."""


@dataclass(frozen=True)
class TritonInstall:
    server: Path                 # the tritonserver executable
    python_backend: Path         # folder holding libtriton_python.so + triton_python_backend_utils.py
    stub: Path                   # triton_python_backend_stub for this interpreter
    lib_dirs: List[Path] = field(default_factory=list)  # needed on LD_LIBRARY_PATH
    source: str = "custom"       # "pytriton" or "custom"

    def environment(self, base: Optional[dict] = None) -> dict:
        """Environment for the server process and its stubs.

        The stub's embedded interpreter finds `python3` on PATH and reads that venv's
        pyvenv.cfg, so the running interpreter's bin/ must come first on PATH for model
        code to import numpy, torch and latte.
        """
        env = dict(os.environ if base is None else base)
        bin_dir = str(Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([bin_dir] + [p for p in env.get("PATH", "").split(os.pathsep) if p])
        libs = [str(p) for p in self.lib_dirs]
        libdir = sysconfig.get_config_var("LIBDIR")
        if libdir:
            # The stub links libpython3.X: take the one of this interpreter, not the system's.
            libs.insert(0, libdir)
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs + ([old] if old else []))
        # The model code must see the same latte as this process.
        return env


def _python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def pytriton_root() -> Optional[Path]:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _from_pytriton() -> Optional[TritonInstall]:
    root = pytriton_root()
    if root is None:
        return None
    server = root / "tritonserver" / "bin" / "tritonserver"
    backend = root / "tritonserver" / "backends" / "python"
    stub = root / "tritonserver" / "python_backend_stubs" / _python_tag() / "triton_python_backend_stub"
    libs = root.parent / "nvidia_pytriton.libs"
    if not (server.exists() and backend.exists()):
        return None
    if not stub.exists():
        raise TritonNotFound(
            f"nvidia-pytriton has no Python backend stub for Python {_python_tag()} (looked for {stub})"
        )
    return TritonInstall(server=server, python_backend=backend, stub=stub, lib_dirs=[libs], source="pytriton")


def _from_custom(tritonserver: Optional[str], backend_directory: Optional[str]) -> TritonInstall:
    server_path = tritonserver or shutil.which("tritonserver")
    if not server_path:
        raise TritonNotFound("no tritonserver given and none on PATH")
    server = Path(server_path)
    if server.is_dir():
        server = server / "bin" / "tritonserver"
    if not server.exists():
        raise TritonNotFound(f"tritonserver not found at {server}")
    backends = Path(backend_directory) if backend_directory else server.parent.parent / "backends"
    python_backend = backends / "python"
    if not (python_backend / "libtriton_python.so").exists():
        raise TritonNotFound(
            f"no Python backend at {python_backend} (expected libtriton_python.so); "
            "pass --backend-directory pointing at the folder that holds python/"
        )
    stub = python_backend / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonNotFound(f"no triton_python_backend_stub in {python_backend}")
    lib_dirs = [d for d in (server.parent.parent / "lib",) if d.exists()]
    return TritonInstall(server=server, python_backend=python_backend, stub=stub, lib_dirs=lib_dirs)


def find_triton(tritonserver: Optional[str] = None, backend_directory: Optional[str] = None) -> TritonInstall:
    """The Triton install to use: explicit arguments, then environment, then nvidia-pytriton."""
    tritonserver = tritonserver or os.environ.get("LATTE_TRITONSERVER")
    backend_directory = backend_directory or os.environ.get("LATTE_TRITON_BACKENDS")
    if tritonserver or backend_directory:
        return _from_custom(tritonserver, backend_directory)
    install = _from_pytriton()
    if install is not None:
        return install
    if shutil.which("tritonserver"):
        return _from_custom(None, None)
    raise TritonNotFound(
        "no tritonserver found: install it with `pip install --no-deps nvidia-pytriton==0.7.0` "
        "(what `make demo` does) or pass --tritonserver PATH --backend-directory DIR"
    )
