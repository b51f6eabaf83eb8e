"""Stopping a run of rounds on time: one more round only where it ends within the budget."""

from __future__ import annotations

import time


def another_round_fits(since: float, done: int, budget_s: float, more: int = 1) -> bool:
    """Whether `more` rounds, each as long as the average of the `done` rounds since `since`
    (time.monotonic()), end within `budget_s` of `since`. The first round always runs."""
    if not done or budget_s <= 0:
        return True
    return (time.monotonic() - since) * (done + more) / done <= budget_s
