"""The figures of latte's own metrics the health rules judge: each model's request latency
histogram (summed over priorities) and its arena's fragmentation alarm."""

from __future__ import annotations

import math
import urllib.error
from typing import Dict, Optional, Tuple

from latte.bench.prometheus_scrape import MetricsFormatError, parse_prometheus, split_key
from latte.supervision.rules import Histogram

_BUCKET = "latte_request_duration_us_bucket"
_FRAGMENTED = "latte_arena_fragmented"


def model_figures(values: Dict[str, float]) -> Dict[str, Tuple[Optional[Histogram], Optional[bool]]]:
    buckets: Dict[str, Dict[float, float]] = {}
    fragmented: Dict[str, bool] = {}
    for key, value in values.items():
        name, labels = split_key(key)
        model = labels.get("model")
        if model is None:
            continue
        if name == _BUCKET:
            le = math.inf if labels.get("le") in ("+Inf", "Inf") else float(labels.get("le", "nan"))
            per = buckets.setdefault(model, {})
            per[le] = per.get(le, 0.0) + value
        elif name == _FRAGMENTED:
            fragmented[model] = fragmented.get(model, False) or value >= 1.0
    figures = {}
    for model in set(buckets) | set(fragmented):
        histogram = None
        if model in buckets:
            bounds = sorted(b for b in buckets[model] if math.isfinite(b))
            counts = [buckets[model][b] for b in bounds] + [buckets[model].get(math.inf, 0.0)]
            histogram = (tuple(bounds), tuple(counts))
        figures[model] = (histogram, fragmented.get(model))
    return figures


def read_model_metrics(url: str, timeout: float = 2.0):
    """model_figures of the server's metrics page, or None when it cannot be read."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text = response.read().decode("utf-8", errors="replace")
        return model_figures(parse_prometheus(text, prefixes=("latte_",)))
    except (urllib.error.URLError, OSError, MetricsFormatError, ValueError):
        return None
