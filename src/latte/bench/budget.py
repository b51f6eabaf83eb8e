"""Stopping a run of rounds on time: one more round only where it ends within the budget."""

from __future__ import annotations

import time
from typing import Callable, Iterator


def another_round_fits(since: float, done: int, budget_s: float, more: int = 1) -> bool:
    """Whether `more` rounds, each as long as the average of the `done` rounds since `since`
    (time.monotonic()), end within `budget_s` of `since`. The first round always runs."""
    if not done or budget_s <= 0:
        return True
    return (time.monotonic() - since) * (done + more) / done <= budget_s


def rounds_within(rounds: int, budget_s: float, unit: str = "round",
                  log: Callable[[str], None] = lambda line: print(line, flush=True)) -> Iterator[int]:
    """The round numbers 0 .. rounds - 1, timed from the first: before a round that would not end
    within `budget_s` (another_round_fits), `log` says so (naming rounds by `unit`) and they stop."""
    since = time.monotonic()
    for done in range(rounds):
        if not another_round_fits(since, done, budget_s):
            log(f"  stopping after {done} {unit}(s): another would pass --budget-s {budget_s:g}")
            return
        yield done
