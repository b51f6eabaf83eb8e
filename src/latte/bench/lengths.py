"""Length distributions for variable-shape inputs: fixed, uniform, lognormal, Zipf buckets.

Written on the command line as KIND[:key=value,...], e.g. `lognormal:median=24,sigma=0.8`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np

KINDS = {
    "fixed": ("length",),
    "uniform": ("low", "high"),
    "lognormal": ("median", "sigma"),
    "zipf": ("buckets", "s"),
}
EXAMPLES_TEXT = "fixed:length=32, uniform:low=1,high=128, lognormal:median=24,sigma=0.8, zipf:buckets=8-16-32-64-128,s=1.2"


class LengthSpecError(ValueError):
    """A length distribution was written wrongly."""


@dataclass(frozen=True)
class LengthDistribution:
    kind: str
    params: Tuple[Tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> "LengthDistribution":
        kind, _, rest = text.strip().partition(":")
        if kind not in KINDS:
            raise LengthSpecError(f"unknown length distribution {kind!r}; expected one of {', '.join(KINDS)} "
                                  f"(e.g. {EXAMPLES_TEXT})")
        params: Dict[str, str] = {}
        for item in filter(None, rest.split(",")):
            key, sep, value = item.partition("=")
            if not sep or key not in KINDS[kind]:
                raise LengthSpecError(f"{kind} takes {', '.join(k + '=...' for k in KINDS[kind])}; got {item!r}")
            params[key] = value
        dist = cls(kind, tuple(sorted(params.items())))
        dist.sample(np.random.default_rng(0), 1, 1_000_000)  # validates the values now, not mid-run
        return dist

    def _get(self, key: str, default: float) -> float:
        raw = dict(self.params).get(key)
        if raw is None:
            return default
        try:
            return float(raw)
        except ValueError:
            raise LengthSpecError(f"{self.kind}: {key} must be a number, got {raw!r}") from None

    def _buckets(self, maximum: int) -> np.ndarray:
        raw = dict(self.params).get("buckets")
        try:
            buckets = [int(b) for b in raw.split("-")] if raw else [8, 16, 32, 64, 128]
        except ValueError:
            raise LengthSpecError(f"zipf: buckets must be lengths joined by '-', e.g. 8-16-32, got {raw!r}") from None
        if not buckets or min(buckets) < 1:
            raise LengthSpecError(f"zipf: bucket lengths must be >= 1, got {buckets}")
        return np.array([min(b, maximum) for b in buckets])

    def sample(self, rng: np.random.Generator, count: int, maximum: int) -> np.ndarray:
        """`count` lengths, each in 1..maximum."""
        if maximum < 1:
            raise LengthSpecError(f"the maximum length must be >= 1, got {maximum}")
        if self.kind == "fixed":
            length = self._get("length", min(32, maximum))
            if length < 1:
                raise LengthSpecError(f"fixed: length must be >= 1, got {length:g}")
            out = np.full(count, length)
        elif self.kind == "uniform":
            low, high = self._get("low", 1), self._get("high", maximum)
            if not 1 <= low <= high:
                raise LengthSpecError(f"uniform: need 1 <= low <= high, got low={low:g} high={high:g}")
            out = rng.integers(int(low), int(high) + 1, size=count)
        elif self.kind == "lognormal":
            median, sigma = self._get("median", min(24, maximum)), self._get("sigma", 0.8)
            if median < 1 or sigma <= 0:
                raise LengthSpecError(f"lognormal: need median >= 1 and sigma > 0, got {median:g}, {sigma:g}")
            out = np.rint(rng.lognormal(np.log(median), sigma, size=count))
        else:
            s = self._get("s", 1.2)
            if s <= 0:
                raise LengthSpecError(f"zipf: s must be > 0, got {s:g}")
            buckets = self._buckets(maximum)
            # Bucket k (1-based, shortest first) is chosen with weight 1/k^s: short requests dominate.
            weights = 1.0 / np.arange(1, len(buckets) + 1) ** s
            out = rng.choice(np.sort(buckets), size=count, p=weights / weights.sum())
        return np.clip(out, 1, maximum).astype(np.int64)

    def describe(self) -> str:
        inner = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.kind}:{inner}" if inner else self.kind
