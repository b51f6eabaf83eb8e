"""The load each generated model is planned for, kept in the repository for `latte verify` and `latte tune`.

`latte generate` writes REPO/latte_plan.json: per latte model its SLO, the request rate
its settings were derived for (the spec's arrival rate, else 80% of the throughput the
derivation promises at the SLO) and where its profile lies. Triton reads only model
folders, so a file at the repository's top level is invisible to the server.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Optional

PLAN_FILE = "latte_plan.json"


@dataclass(frozen=True)
class OperatingPoint:
    slo_ms: float
    rate: float                   # requests/s the settings are for
    rate_source: str              # "arrival_rate" or "derived"
    profile: Optional[str] = None  # the profile the settings came from


def write_operating_points(repo: Path, points: Dict[str, OperatingPoint]) -> Path:
    path = Path(repo) / PLAN_FILE
    path.write_text(json.dumps({name: asdict(p) for name, p in sorted(points.items())}, indent=2) + "\n")
    return path


def read_operating_points(repo: Path) -> Dict[str, OperatingPoint]:
    """The repository's planned loads; empty for a repository `latte generate` did not write."""
    path = Path(repo) / PLAN_FILE
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {name: OperatingPoint(**entry) for name, entry in raw.items()}
    except (json.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"{path}: not a plan file `latte generate` writes ({exc}); regenerate the repository") from None
