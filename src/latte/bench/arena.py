"""Memory-arena and session figures from Latte's Prometheus series, whatever of them a server exports.

The backend exports latte_arena_bytes{state=capacity|reserved|live|allocated|peak_live},
latte_arena_fragmentation{kind=internal|external}, the fragmentation alarm's
latte_arena_fit_bytes{figure=largest_free_block|p99_request}, latte_arena_fragmented and
latte_arena_failures{kind=all|fragmentation}, and latte_sessions{state=live|started|...},
each labelled with its model.
"""

from __future__ import annotations

from typing import Dict, Optional

from latte.bench.prometheus_scrape import split_key


def _sum(metrics: Dict[str, float], name: str, model: Optional[str], **labels: str) -> Optional[float]:
    found = None
    for key, value in metrics.items():
        series, series_labels = split_key(key)
        if series != name or any(series_labels.get(k) != v for k, v in labels.items()):
            continue
        if model is not None and series_labels.get("model", model) != model:
            continue
        found = (found or 0.0) + value
    return found


def _max(metrics: Dict[str, float], name: str, model: Optional[str], **labels: str) -> Optional[float]:
    values = [v for k, v in metrics.items()
              if split_key(k)[0] == name
              and all(split_key(k)[1].get(a) == b for a, b in labels.items())
              and (model is None or split_key(k)[1].get("model", model) == model)]
    return max(values) if values else None


def arena_figures(metrics: Dict[str, float], model: Optional[str] = None) -> Dict[str, Optional[float]]:
    """Reserved/live bytes, fragmentation (0..1) and live sessions of `model` (all models if None);
    None where the server does not export the figure."""
    reserved = _sum(metrics, "latte_arena_bytes", model, state="reserved")
    live = _sum(metrics, "latte_arena_bytes", model, state="live")
    # External fragmentation is what makes an arena grow while live bytes stay flat.
    fragmentation = _max(metrics, "latte_arena_fragmentation", model, kind="external")
    if fragmentation is None and reserved and live is not None:
        fragmentation = max(0.0, 1.0 - live / reserved)
    return {"arena_reserved_bytes": reserved, "arena_live_bytes": live, "fragmentation": fragmentation,
            "internal_fragmentation": _max(metrics, "latte_arena_fragmentation", model, kind="internal"),
            "live_sessions": _sum(metrics, "latte_sessions", model, state="live"),
            # The figures that can alarm (docs/memory.md).
            "arena_fragmented": _max(metrics, "latte_arena_fragmented", model),
            "arena_fragmentation_failures": _sum(metrics, "latte_arena_failures", model, kind="fragmentation"),
            "arena_largest_free_bytes": _max(metrics, "latte_arena_fit_bytes", model, figure="largest_free_block"),
            "arena_p99_request_bytes": _max(metrics, "latte_arena_fit_bytes", model, figure="p99_request")}
