"""The load each generated model is planned for, kept in the repository for `latte verify` and `latte tune`.

`latte generate` writes REPO/latte_plan.json: per latte model its SLO, the request rate
its settings were derived for (the spec's arrival rate, else 80% of the throughput the
derivation promises at the SLO) and where its profile lies; per ensemble the rate its
steps sustain together. Triton reads only model folders, so a file at the repository's
top level is invisible to the server.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

from latte.generator.derive import TARGET_UTILISATION, shared_host_rate

PLAN_FILE = "latte_plan.json"


@dataclass(frozen=True)
class OperatingPoint:
    slo_ms: float
    rate: float                   # requests/s the settings are for
    rate_source: str              # "arrival_rate" or "derived"
    profile: Optional[str] = None  # the profile the settings came from
    # A streaming model's: slo_ms is its inter-token SLO; verify drives `streams` concurrent
    # streams of `max_tokens` outputs and holds TTFT to ttft_ms.
    ttft_ms: Optional[float] = None
    streams: Optional[int] = None
    max_tokens: Optional[int] = None


def plan_operating_points(spec, plans: List, profiles_dir: Path) -> Dict[str, OperatingPoint]:
    """The planned load of every latte model and ensemble of a generated spec.

    An ensemble request passes through every step on the same cores, so the ensemble
    sustains the shared-host rate of its steps: a latte step's promised throughput; a
    python step (computing little, one request per execute) the calibration's request
    ceiling and the serving cost of a batch of one, one after the other. Its SLO is the
    tightest of its latte steps'.
    """
    by_name = {p.name: p for p in plans}
    points: Dict[str, OperatingPoint] = {}
    for plan in plans:
        streaming = plan.stream_derivation
        if streaming is not None:
            entry = spec.model(plan.name)
            profile = entry.profile if entry.profile is not None else Path(profiles_dir) / f"{plan.name}.json"
            points[plan.name] = OperatingPoint(
                slo_ms=streaming.itl_slo_ms, rate=entry.arrival_rate or TARGET_UTILISATION * streaming.streams_per_s,
                rate_source="arrival_rate" if entry.arrival_rate else "derived", profile=str(profile),
                ttft_ms=streaming.ttft_slo_ms, streams=streaming.max_streams, max_tokens=streaming.max_tokens)
        if plan.derivation is None:
            continue
        entry = spec.model(plan.name)
        profile = entry.profile if entry.profile is not None else Path(profiles_dir) / f"{plan.name}.json"
        points[plan.name] = OperatingPoint(slo_ms=plan.derivation.slo_ms, rate=plan.derivation.planned_rate,
                                           rate_source="arrival_rate" if entry.arrival_rate else "derived",
                                           profile=str(profile))
    for ensemble in spec.ensembles:
        latte = [by_name[s.model] for s in ensemble.steps if s.model in points]
        if not latte:
            continue
        given = [spec.model(p.name).arrival_rate for p in latte if spec.model(p.name).arrival_rate]
        slo = min(p.derivation.slo_ms for p in latte)
        if given:
            points[ensemble.name] = OperatingPoint(slo_ms=slo, rate=min(given), rate_source="arrival_rate")
            continue
        serving = next((p.profile.serving for p in latte if p.profile.serving), None)
        python_rate = 0.0
        if serving is not None and serving.max_rate and serving.batch_overhead_ms(1) > 0:
            python_rate = shared_host_rate([serving.max_rate, 1000.0 / serving.batch_overhead_ms(1)])
        rates = [by_name[s.model].derivation.throughput if s.model in points else python_rate
                 for s in ensemble.steps]
        if all(rates):
            points[ensemble.name] = OperatingPoint(slo_ms=slo, rate=TARGET_UTILISATION * shared_host_rate(rates),
                                                   rate_source="derived")
    return points


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
