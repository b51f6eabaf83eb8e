"""When will a model break its SLO? Latency fitted against uptime, as services that degrade over
days are watched: a straight line and a quadratic, the one with the smaller error on the
samples held out (the latest quarter) chosen, refitted on all of them, and projected forward to
where it crosses the SLO (the quadratic only where it predicts the held-out samples
clearly better). The soak report (`latte bench --soak`) and `latte watch` print it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence

import numpy as np

HELD_OUT = 0.25          # the latest share of the samples each fit is judged on
MIN_SAMPLES = 6          # fewer cannot hold out enough to choose between the fits
HORIZON_S = 30 * 86400   # a crossing further out than this is reported as none
QUADRATIC_GAIN = 0.9     # the quadratic's held-out error must be below this share of the line's
UPWARD_SIGMAS = 3.0      # how many standard errors above zero a slope must be to count as a trend


@dataclass(frozen=True)
class Forecast:
    kind: str                    # "linear" or "quadratic": the fit chosen
    coefficients: List[float]    # highest power first, latency (ms) in uptime (s)
    held_out_rmse_ms: dict       # each fit's error on the held-out samples
    slope_ms_per_h: float        # the chosen fit's slope at the last sample
    slope_stderr_ms_per_h: float  # the standard error of that slope, from the fit's covariance
    r2: float                    # of the chosen fit over all samples
    crossing_s: Optional[float]  # uptime at which the fit reaches the SLO; None: not within HORIZON_S
    now_s: float                 # uptime of the last sample
    slo_ms: float

    @property
    def upward(self) -> bool:
        """A slope above zero by more than UPWARD_SIGMAS standard errors (on flat Gaussian
        noise about 1 % of runs read as upward, from 10 samples as from 40)."""
        return self.slope_ms_per_h > UPWARD_SIGMAS * self.slope_stderr_ms_per_h

    def predict(self, uptime_s) -> np.ndarray:
        return np.polyval(self.coefficients, np.asarray(uptime_s, dtype=float))

    def text(self) -> str:
        fit = f"{self.kind} fit (R² {self.r2:.2f})"
        slope = f"{self.slope_ms_per_h:+.3g} ± {self.slope_stderr_ms_per_h:.2g} ms/h"
        if self.predict(self.now_s) >= self.slo_ms:
            return f"P95 already above the {self.slo_ms:g} ms SLO: {fit}, slope {slope}"
        if not self.upward:
            return f"no upward trend: {fit}, slope {slope}"
        if self.crossing_s is None:
            return f"upward trend, no SLO crossing within {HORIZON_S / 86400:.0f} days: {fit}, slope {slope}"
        left_h = (self.crossing_s - self.now_s) / 3600
        return (f"P95 projected to cross the {self.slo_ms:g} ms SLO in {left_h:.3g} h "
                f"(at {self.crossing_s / 3600:.3g} h of uptime): {fit}, slope {slope}")

    def as_dict(self) -> dict:
        return {**asdict(self), "upward": self.upward, "text": self.text()}

    @classmethod
    def from_dict(cls, figures: dict) -> "Forecast":
        """The forecast `as_dict` wrote (a soak's results), its derived fields left out."""
        return cls(**{name: figures[name] for name in cls.__dataclass_fields__})


def _rmse(coefficients, x, y) -> float:
    return float(np.sqrt(np.mean((np.polyval(coefficients, x) - y) ** 2)))


def _crossing(coefficients, now_s: float, slo_ms: float) -> Optional[float]:
    """The first uptime after now at which the fit reaches the SLO (already above: now)."""
    if np.polyval(coefficients, now_s) >= slo_ms:
        return now_s
    shifted = np.array(coefficients, dtype=float)
    shifted[-1] -= slo_ms
    roots = [r.real for r in np.roots(shifted) if abs(r.imag) < 1e-9 and now_s < r.real <= now_s + HORIZON_S]
    return min(roots) if roots else None


def fit_latency(uptime_s: Sequence[float], latency_ms: Sequence[float], slo_ms: float) -> Forecast:
    """The better of a linear and a quadratic fit of latency against uptime, and where it
    reaches `slo_ms`. Raises ValueError with fewer than MIN_SAMPLES finite samples."""
    x = np.asarray(uptime_s, dtype=float)
    y = np.asarray(latency_ms, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) < MIN_SAMPLES:
        raise ValueError(f"a forecast needs at least {MIN_SAMPLES} samples, got {len(x)}")
    cut = len(x) - max(2, int(round(len(x) * HELD_OUT)))
    errors = {}
    for kind, degree in (("linear", 1), ("quadratic", 2)):
        errors[kind] = _rmse(np.polyfit(x[:cut], y[:cut], degree), x[cut:], y[cut:])
    # The quadratic only where it predicts the held-out samples clearly better: with as good a
    # fit, the line extrapolates more soberly.
    gain = errors["linear"] - errors["quadratic"]
    kind = "quadratic" if gain > max(1e-6, (1 - QUADRATIC_GAIN) * errors["linear"]) else "linear"
    degree = 1 if kind == "linear" else 2
    coefficients, covariance = np.polyfit(x, y, degree, cov=True)
    # The slope at the last sample, and its standard error from the same fit's covariance.
    gradient = np.array([2 * x[-1], 1.0, 0.0]) if degree == 2 else np.array([1.0, 0.0])
    slope = float(np.polyval(np.polyder(coefficients), x[-1])) * 3600
    slope_stderr = float(np.sqrt(max(gradient @ covariance @ gradient, 0.0))) * 3600
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((np.polyval(coefficients, x) - y) ** 2)) / total if total > 0 else 1.0
    return Forecast(kind=kind, coefficients=[float(c) for c in coefficients], held_out_rmse_ms=errors,
                    slope_ms_per_h=slope, slope_stderr_ms_per_h=slope_stderr,
                    r2=r2, crossing_s=_crossing(coefficients, float(x[-1]), slo_ms), now_s=float(x[-1]),
                    slo_ms=slo_ms)


def forecast_figure(uptime_s: Sequence[float], latency_ms: Sequence[float], forecast: Forecast, title: str) -> bytes:
    """The samples, the chosen fit carried forward to the crossing (or a quarter past the last
    sample), and the SLO line, as PNG bytes."""
    from latte.bench.plots import _png, plt

    end_s = forecast.crossing_s if forecast.crossing_s is not None and forecast.upward else forecast.now_s * 1.25
    # Seconds, minutes or hours, whichever reads best for how far the figure reaches.
    unit, scale = next((u, f) for u, f, upto in (("s", 1, 120), ("min", 60, 7200), ("h", 3600, math.inf))
                       if max(end_s, forecast.now_s) <= upto)
    x = np.asarray(uptime_s, dtype=float) / scale
    span = np.linspace(0, max(end_s, forecast.now_s) / scale, 200)
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    ax.plot(x, latency_ms, "o", color="#1f77b4", markersize=4, label="P95 per window")
    ax.plot(span, forecast.predict(span * scale), "-", color="#d62728", label=f"{forecast.kind} fit, projected")
    ax.axhline(forecast.slo_ms, color="#555555", linestyle="--", linewidth=1, label=f"SLO {forecast.slo_ms:g} ms")
    ax.set_xlabel(f"uptime ({unit})")
    ax.set_ylabel("P95 latency (ms)")
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)
