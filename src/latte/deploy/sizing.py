"""How many replicas a target request rate needs.

A replica's capacity is its measured throughput at the operating point (the
concurrency where its p99 latency still meets the budget), as perf_analyzer or
`latte demo` reports it. Replicas scale that capacity linearly, so

    replicas = ceil(target_rps * (1 + headroom) / throughput_rps)

Headroom keeps the fleet below saturation while the autoscaler reacts to a burst.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

from latte.deploy.errors import DeployError


def _positive(value, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DeployError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise DeployError(f"{what} must be a positive number, got {value!r}")
    return number


def replicas_for_rate(target_rps: float, profile: Mapping, headroom: float = 0.0,
                      p99_budget_ms: Optional[float] = None) -> int:
    """Replicas that serve `target_rps` given one replica's profile {throughput_rps, p99_ms}.

    `headroom` is the spare fraction kept on top (0.2 = 20 %). When `p99_budget_ms` is
    given, a profile whose p99 exceeds it is refused: adding replicas raises capacity,
    it does not make one request faster.
    """
    target = _positive(target_rps, "target request rate (--target-rps)")
    if not isinstance(profile, Mapping) or "throughput_rps" not in profile:
        raise DeployError(f"a replica profile needs 'throughput_rps' (and optionally 'p99_ms'), got {profile!r}")
    throughput = _positive(profile["throughput_rps"], "replica throughput (throughput_rps)")
    try:
        spare = float(headroom)
    except (TypeError, ValueError):
        raise DeployError(f"headroom must be a fraction such as 0.2, got {headroom!r}") from None
    if not 0 <= spare < 10:
        raise DeployError(f"headroom must be a fraction in [0, 10), got {headroom!r}")
    if p99_budget_ms is not None and profile.get("p99_ms") is not None:
        p99 = _positive(profile["p99_ms"], "replica p99 latency (p99_ms)")
        budget = _positive(p99_budget_ms, "p99 budget")
        if p99 > budget:
            raise DeployError(
                f"one replica's p99 is {p99:g} ms at {throughput:g} req/s, over the {budget:g} ms budget; "
                "measure the throughput at a lower concurrency where p99 meets the budget"
            )
    # The small tolerance keeps 300/100 at 3 instead of 4 after float rounding.
    return max(1, math.ceil(target * (1 + spare) / throughput - 1e-9))


def canary_replicas(stable_replicas: int, percent: int) -> int:
    """Canary pods beside `stable_replicas` so that about `percent` % of the pods, and so of a Service's
    traffic (it spreads connections over ready pods evenly), reach the canary; at least one."""
    if not 1 <= percent <= 99:
        raise DeployError(f"--canary-percent must be 1..99 for a split by replicas, got {percent!r}")
    return max(1, round(stable_replicas * percent / (100 - percent)))
