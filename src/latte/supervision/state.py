"""The state folder `latte serve` keeps outside the models' processes.

A model's process may die at any time; what must outlive it lives here, one fact one file:

    <state>/<model>/flight/<instance>.<pid>   what that process is running (flight.FlightRecorder)
    <state>/<model>/poison.json               inputs in flight at its crashes (poison.PoisonList)
    <state>/<model>/sessions/                 sessions' last committed turns (checkpoint.SessionCheckpoint)

`latte serve` hands the folder to tritonserver, and so to every model's process, in the
environment variable LATTE_STATE_DIR. A model served without it (a bare tritonserver) keeps
no state outside its process and behaves as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

STATE_DIR_ENV = "LATTE_STATE_DIR"


def state_dir(environ: Mapping[str, str] = os.environ) -> Optional[Path]:
    """The state folder this process was given, or None when it was given none."""
    value = environ.get(STATE_DIR_ENV, "").strip()
    return Path(value) if value else None


def model_dir(state: Path, model: str) -> Path:
    return Path(state) / model


def flight_dir(state: Path, model: str) -> Path:
    return model_dir(state, model) / "flight"


def flight_path(state: Path, model: str, instance: str, pid: int) -> Path:
    return flight_dir(state, model) / f"{instance}.{pid}"


def poison_path(state: Path, model: str) -> Path:
    return model_dir(state, model) / "poison.json"


def sessions_dir(state: Path, model: str) -> Path:
    return model_dir(state, model) / "sessions"
