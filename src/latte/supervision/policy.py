"""When a model that died is restarted, and when it is given up.

A model that dies is restarted at once the first time; each further death within the window
waits twice as long as the one before (capped), so a model that crashes on every request does
not spin. After `max_restarts` restarts within `window_s`, the next death gives it up: it stays
down until an operator loads it again.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Deque, Optional


class PolicyError(ValueError):
    """A restart policy that cannot work (a setting out of range)."""


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5
    window_s: float = 600.0
    first_delay_s: float = 0.0
    backoff_base_s: float = 1.0
    max_delay_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise PolicyError(f"max restarts must be >= 0, got {self.max_restarts}")
        if self.window_s <= 0:
            raise PolicyError(f"the restart window must be > 0 seconds, got {self.window_s:g}")
        if self.backoff_base_s < 0 or self.max_delay_s < 0 or self.first_delay_s < 0:
            raise PolicyError("restart delays must be >= 0 seconds")


class RestartBudget:
    """One model's restarts within the policy's window."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._restarts: Deque[float] = collections.deque()

    def _recent(self, now: float) -> int:
        while self._restarts and now - self._restarts[0] > self.policy.window_s:
            self._restarts.popleft()
        return len(self._restarts)

    def next_delay(self, now: float) -> Optional[float]:
        """Seconds to wait before the next restart, or None when the model is to be given up."""
        recent = self._recent(now)
        if recent >= self.policy.max_restarts:
            return None
        if recent == 0:
            return self.policy.first_delay_s
        return min(self.policy.max_delay_s, self.policy.backoff_base_s * 2 ** (recent - 1))

    def spend(self, now: float) -> None:
        self._restarts.append(now)

    def used(self, now: float) -> int:
        return self._recent(now)
