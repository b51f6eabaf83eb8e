"""Finding, laying out and running a real Triton Inference Server."""

from latte.triton.locate import TritonInstall, TritonNotFound, find_triton
from latte.triton.backend_dir import install_backend
from latte.triton.server import ServerStartError, TritonServer

__all__ = [
    "TritonInstall",
    "TritonNotFound",
    "find_triton",
    "install_backend",
    "TritonServer",
    "ServerStartError",
]
