"""The measured latency curve of one model: what `latte profile` writes to profile.json.

A profile holds one `Point` per (batch size, shape bucket). Fixed-shape models have a
single bucket (`length` None); ragged inputs are measured at several sequence lengths.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from latte.generator.calibrate import ServingCost


class ProfileError(ValueError):
    """A profile file that is missing fields or holds impossible numbers."""


def latency_ceiling_ms(slo_ms: float) -> float:
    """The slowest call worth profiling for a P99 SLO: a request that arrives just after a
    launch waits for that batch and its own, so a batch slower than half the SLO never fits."""
    return slo_ms / 2.0


@dataclass(frozen=True)
class Point:
    batch_size: int
    length: Optional[int]        # sequence length of the shape bucket; None for fixed shapes
    mean_ms: float
    p50_ms: float
    p99_ms: float
    peak_bytes: int              # memory the call needed beyond what was resident before it

    @property
    def throughput(self) -> float:
        """Inferences (rows) per second at this batch size, from the mean latency."""
        return self.batch_size * 1000.0 / self.mean_ms


@dataclass
class Profile:
    model_file: str
    runtime: str
    device: str
    intra_op_threads: int
    inputs: List[dict]           # [{name, data_type, dims}] without the batch dimension
    outputs: List[dict]
    points: List[Point]
    wall_s: float = 0.0
    stop_reason: Dict[str, str] = field(default_factory=dict)   # bucket -> why the sweep stopped
    serving: Optional[ServingCost] = None   # this machine's serving cost, measured by `latte profile`
    max_latency_ms: Optional[float] = None  # the sweep's latency ceiling; None: unknown (older profiles)

    def covers_slo(self, slo_ms: float) -> bool:
        """Whether every batch size that could fit slo_ms was measured (not cut by a lower ceiling)."""
        return self.max_latency_ms is None or self.max_latency_ms >= latency_ceiling_ms(slo_ms)

    def buckets(self) -> List[Optional[int]]:
        lengths = {p.length for p in self.points}
        return sorted(lengths, key=lambda x: -1 if x is None else x)

    def curve(self, length: Optional[int] = None) -> List[Point]:
        """Points of one bucket by batch size; the largest bucket (the worst case) by default."""
        if length is None:
            buckets = self.buckets()
            length = buckets[-1] if buckets else None
        return sorted((p for p in self.points if p.length == length), key=lambda p: p.batch_size)

    @property
    def ragged(self) -> bool:
        return any(p.length is not None for p in self.points)

    def to_json(self) -> dict:
        data = asdict(self)
        data["points"] = [{**asdict(p), "throughput": round(p.throughput, 3)} for p in self.points]
        data["serving"] = self.serving.to_json() if self.serving else None
        return data

    def save(self, path: Path) -> Path:
        return write_profile(path, self.to_json())

    @classmethod
    def from_json(cls, data: dict, source: str = "profile") -> "Profile":
        required = ("model_file", "runtime", "intra_op_threads", "inputs", "outputs", "points")
        missing = [k for k in required if k not in data]
        if missing:
            raise ProfileError(f"{source}: missing {', '.join(missing)}")
        points = []
        for i, raw in enumerate(data["points"]):
            try:
                point = Point(batch_size=int(raw["batch_size"]), length=raw.get("length"),
                              mean_ms=float(raw["mean_ms"]), p50_ms=float(raw["p50_ms"]),
                              p99_ms=float(raw["p99_ms"]), peak_bytes=int(raw.get("peak_bytes", 0)))
            except (KeyError, TypeError, ValueError) as exc:
                raise ProfileError(f"{source}: points[{i}] is malformed ({exc}); expected batch_size, "
                                   "mean_ms, p50_ms, p99_ms, peak_bytes") from None
            if point.batch_size < 1 or point.mean_ms <= 0 or point.p99_ms <= 0:
                raise ProfileError(f"{source}: points[{i}] needs batch_size >= 1 and positive latencies")
            points.append(point)
        if not points:
            raise ProfileError(f"{source}: the profile has no measurements")
        return cls(model_file=data["model_file"], runtime=data["runtime"], device=data.get("device", "cpu"),
                   intra_op_threads=int(data["intra_op_threads"]), inputs=list(data["inputs"]),
                   outputs=list(data["outputs"]), points=points, wall_s=float(data.get("wall_s", 0.0)),
                   stop_reason=dict(data.get("stop_reason", {})),
                   max_latency_ms=float(data["max_latency_ms"]) if data.get("max_latency_ms") is not None else None,
                   serving=ServingCost.from_json(data["serving"]) if data.get("serving") else None)

    @classmethod
    def load(cls, path: Path) -> "Profile":
        return cls.from_json(read_profile(path, "MODEL_FILE"), str(Path(path)))


def write_profile(path: Path, data: dict) -> Path:
    """A profile's JSON (`to_json`) written to `path`."""
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
    return Path(path)


def read_profile(path: Path, made_from: str) -> dict:
    """The JSON of the profile at `path`; where there is none, the error says how to make one
    (`latte profile MADE_FROM`)."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"profile {path} does not exist; create it with `latte profile {made_from}`") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: not JSON ({exc})") from None
