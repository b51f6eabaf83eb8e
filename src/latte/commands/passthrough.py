"""`latte tritonserver ARGS...` and `latte perf-analyzer ARGS...`: Triton's own programs as
Latte installs them, started with the environment they need (the Python backend's stub finds
this Python environment; the bundled libraries are on the loader's path). Every argument is
passed through unchanged, `--help` included.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict, List


def register(sub: argparse._SubParsersAction) -> None:
    # Listed in `latte --help`; main() hands their arguments over before argparse sees them.
    sub.add_parser("tritonserver", add_help=False,
                   help="the bundled tritonserver, every flag passed through")
    sub.add_parser("perf-analyzer", add_help=False,
                   help="Triton's perf_analyzer, every flag passed through")


def tritonserver_command(argv: List[str]) -> List[str]:
    """The bundled (or LATTE_TRITONSERVER's) tritonserver with ARGS, and latte's backend
    directory unless ARGS name one."""
    from latte.triton import find_triton, install_backend
    from latte.triton.server import default_backend_directory

    install = find_triton()
    command = [str(install.server)]
    if not any(arg.startswith("--backend-directory") for arg in argv):
        backends = default_backend_directory()
        if not (backends / "latte" / "model.py").exists():
            install_backend(backends, install)
        command.append(f"--backend-directory={backends}")
    return command + list(argv)


def _tritonserver(argv: List[str]) -> int:
    from latte.triton import find_triton

    command = tritonserver_command(argv)
    os.execve(command[0], command, find_triton().environment())
    return 1  # not reached: exec replaces this process, so signals reach tritonserver itself


def _perf_analyzer(argv: List[str]) -> int:
    from latte.triton.perf import find_perf_analyzer, perf_analyzer_env

    binary = str(find_perf_analyzer())
    os.execve(binary, [binary, *argv], perf_analyzer_env())
    return 1


PASS_THROUGH: Dict[str, Callable[[List[str]], int]] = {"tritonserver": _tritonserver, "perf-analyzer": _perf_analyzer}


def run(name: str, argv: List[str]) -> int:
    try:
        return PASS_THROUGH[name](argv)
    except Exception as exc:
        print(f"latte {name}: error: {exc}", file=sys.stderr)
        return 1
