"""`latte tritonserver ARGS...` and `latte perf-analyzer ARGS...`: Triton's own programs as
Latte installs them, started with the environment they need (the Python backend's stub finds
this Python environment; the bundled libraries are on the loader's path). Every argument is
passed through unchanged, `--help` included.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List


def register(sub: argparse._SubParsersAction) -> None:
    # Listed in `latte --help`; main() hands their arguments over before argparse sees them.
    sub.add_parser("tritonserver", add_help=False,
                   help="the bundled tritonserver, every flag passed through")
    sub.add_parser("perf-analyzer", add_help=False,
                   help="Triton's perf_analyzer, every flag passed through")


def tritonserver_command(argv: List[str], install=None) -> List[str]:
    """The bundled (or LATTE_TRITONSERVER's) tritonserver with ARGS, and latte's backend
    directory unless ARGS name one."""
    from latte.triton import find_triton, install_backend
    from latte.triton.server import default_backend_directory

    install = install or find_triton()
    command = [str(install.server)]
    if not any(arg.startswith("--backend-directory") for arg in argv):
        backends = default_backend_directory()
        if not (backends / "latte" / "model.py").exists():
            install_backend(backends, install)
        command.append(f"--backend-directory={backends}")
    return command + list(argv)


HELP = ("-h", "--help")


def _exec(command: List[str], env: Dict[str, str], name: str) -> int:
    """Replace this process with the program (signals then reach it directly); for a help
    request, print its usage and succeed: tritonserver exits 1 after its usage and
    perf_analyzer 99, calling --help unrecognized."""
    if len(command) == 2 and command[1] in HELP:
        done = subprocess.run(command[:1] + ["--help"], env=env, capture_output=True, text=True)
        usage = [line for line in (done.stdout + done.stderr).splitlines()
                 if "unrecognized option" not in line and "invalid option" not in line]
        print(f"latte {name}: {Path(command[0]).name} with latte's environment; every argument passes through.")
        print("\n".join(usage))
        return 0
    os.execve(command[0], command, env)
    return 1  # not reached


def _tritonserver(argv: List[str]) -> int:
    from latte.triton import find_triton

    install = find_triton()
    help_only = len(argv) == 1 and argv[0] in HELP  # usage only: no backend directory to lay out
    command = [str(install.server), *argv] if help_only else tritonserver_command(argv, install)
    return _exec(command, install.environment(), "tritonserver")


def _perf_analyzer(argv: List[str]) -> int:
    from latte.triton.perf import find_perf_analyzer, perf_analyzer_env

    binary = str(find_perf_analyzer())
    return _exec([binary, *argv], perf_analyzer_env(), "perf-analyzer")


PASS_THROUGH: Dict[str, Callable[[List[str]], int]] = {"tritonserver": _tritonserver, "perf-analyzer": _perf_analyzer}


def run(name: str, argv: List[str]) -> int:
    try:
        return PASS_THROUGH[name](argv)
    except Exception as exc:
        print(f"latte {name}: error: {exc}", file=sys.stderr)
        return 1
