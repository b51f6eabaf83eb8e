"""Memory-arena and session figures from Latte's Prometheus series, whatever of them a server exports."""

from __future__ import annotations

from typing import Dict, Optional

from latte.bench.metrics import split_key


def _sum_matching(metrics: Dict[str, float], *words: str) -> Optional[float]:
    found = None
    for key, value in metrics.items():
        name, _ = split_key(key)
        if name.startswith("latte_") and all(w in name for w in words):
            found = (found or 0.0) + value
    return found


def arena_figures(metrics: Dict[str, float]) -> Dict[str, Optional[float]]:
    """reserved/live bytes, fragmentation (0..1) and live sessions; None where not exported."""
    reserved = _sum_matching(metrics, "arena", "reserved")
    live = _sum_matching(metrics, "arena", "live")
    fragmentation = _sum_matching(metrics, "arena", "fragmentation")
    if fragmentation is None and reserved and live is not None:
        # Bytes reserved from the system but holding no live block.
        fragmentation = max(0.0, 1.0 - live / reserved)
    sessions = _sum_matching(metrics, "session", "live")
    if sessions is None:
        sessions = _sum_matching(metrics, "sessions")
    return {"arena_reserved_bytes": reserved, "arena_live_bytes": live, "fragmentation": fragmentation,
            "live_sessions": sessions}
