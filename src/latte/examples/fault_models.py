"""Small models that misbehave on purpose: the self-healing tests and the faults benchmark serve
them to see what `latte serve` does when a model's process crashes or hangs.

Both answer Y = X * 2 (X and Y INT64, one value a row, up to 8 rows a batch) and run the same
model.py (latte.examples.faulty_model): X == -1 crashes the model's process with a SIGSEGV,
X == -2 hangs the call, and a `crash_at_load` file in the version folder crashes it as it loads.

    faulty_stock   Triton's stock Python backend (`backend: "python"`), the way Triton users serve
                   their Python code
    faulty         latte (`backend: "latte"`): a graph of one Python step, the same model.py run
                   unchanged as its TritonPythonModel (docs/pipelines.md, "Python steps")

    from latte.examples.fault_models import write_fault_models
    write_fault_models(repo)          # then: latte serve repo
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

# The values and the file faulty_model.py acts on (it imports the stub's module: not imported here).
CRASH = -1
HANG = -2
CRASH_AT_LOAD = "crash_at_load"
STOCK_MODEL = "faulty_stock"
LATTE_MODEL = "faulty"
MODEL_FILE = Path(__file__).with_name("faulty_model.py")
MAX_BATCH_SIZE = 8
INPUT = {"name": "X", "data_type": "TYPE_INT64", "dims": [1]}
OUTPUT = {"name": "Y", "data_type": "TYPE_INT64", "dims": [1]}

__all__ = ["CRASH", "HANG", "CRASH_AT_LOAD", "STOCK_MODEL", "LATTE_MODEL", "write_faulty_stock", "write_faulty",
           "write_fault_models", "crash_at_load"]


def _context(name: str, backend: str, parameters: Optional[Dict[str, str]] = None) -> dict:
    return {
        "name": name, "backend": backend, "max_batch_size": MAX_BATCH_SIZE,
        "inputs": [dict(INPUT)], "outputs": [dict(OUTPUT)],
        "dynamic_batching": {"max_queue_delay_microseconds": 500},
        "instance_groups": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": dict(parameters or {}),
    }


def write_faulty_stock(repo: Path, name: str = STOCK_MODEL, crashing_at_load: bool = False) -> Path:
    """REPO/<name>/: the model.py under Triton's Python backend. Returns the model's folder."""
    from latte.generator.model_folder import write_model

    model_dir = write_model(Path(repo), _context(name, "python"), {"model.py": MODEL_FILE})
    if crashing_at_load:
        crash_at_load(model_dir)
    return model_dir


def write_faulty(repo: Path, name: str = LATTE_MODEL, execute_timeout_s: Optional[float] = None) -> Path:
    """REPO/<name>/: the model.py as the one Python step of a latte graph (1/graph.json, the step
    in 1/steps/faulty/1/model.py). `execute_timeout_s`: the model's own hang limit under
    `latte serve` (parameter execute_timeout_s; default: the server's --execute-timeout, else 60 s).
    Returns the model's folder."""
    from latte.backend.config import GRAPH_FILE
    from latte.backend.graph.definition import GRAPH_FORMAT, STEP_VERSION
    from latte.generator.fuse import FusedModel, write_fused_model

    parameters = {"model_file": GRAPH_FILE, "runtime": "graph"}
    if execute_timeout_s is not None:
        parameters["execute_timeout_s"] = f"{execute_timeout_s:g}"
    step = "faulty"
    graph = {
        "format": GRAPH_FORMAT, "inputs": [dict(INPUT)], "outputs": [dict(OUTPUT)],
        "steps": [{"name": step, "folder": f"steps/{step}", "inputs": {"X": "X"}, "outputs": {"Y": "Y"},
                   "config": {"name": step, "backend": "python", "max_batch_size": MAX_BATCH_SIZE,
                              "input": [dict(INPUT)], "output": [dict(OUTPUT)]}}],
        # What warm-up and the load check send: values that neither crash nor hang it.
        "samples": [{"X": [1]}, {"X": [2]}],
    }
    model = FusedModel(name=name, steps=[step], context=_context(name, "latte", parameters), graph=graph,
                       files={f"steps/{step}/{STEP_VERSION}/model.py": MODEL_FILE})
    return write_fused_model(Path(repo), model)


def write_fault_models(repo: Path, execute_timeout_s: Optional[float] = None) -> Dict[str, Path]:
    """Both models into REPO; returns each one's folder by name."""
    return {STOCK_MODEL: write_faulty_stock(repo), LATTE_MODEL: write_faulty(repo, execute_timeout_s=execute_timeout_s)}


def crash_at_load(model_dir: Path, version: int = 1) -> Path:
    """Make the model in `model_dir` (either of the two) crash as it loads from now on, its next
    restart included; returns the file to remove to stop that."""
    from latte.backend.graph.definition import STEP_VERSION

    version_dir = Path(model_dir) / str(version)
    step_dir = version_dir / "steps" / "faulty" / STEP_VERSION  # latte's: the step's own folder
    marker = (step_dir if step_dir.is_dir() else version_dir) / CRASH_AT_LOAD
    marker.touch()
    return marker
