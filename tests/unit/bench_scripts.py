"""A benchmark script loaded as a module (benchmarks/ is not a package), for tests of what it
makes of a run, as `python benchmarks/NAME.py` would run it."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would: a dataclass of the script looks its module up there
    spec.loader.exec_module(module)
    return module
