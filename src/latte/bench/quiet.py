"""Waiting for a quiet machine before a measurement: the 1-minute load average below a limit."""

from __future__ import annotations

import os
import time
from typing import Callable

QUIET_LOAD = 0.5


def wait_until_quiet(limit: float = QUIET_LOAD, timeout_s: float = 300.0,
                     log: Callable[[str], None] = lambda line: None) -> float:
    """Sleep until the 1-minute load average is below `limit` (at most `timeout_s`); the load
    average then. A run of several parts calls it before each, since the part before loads the
    machine for a minute after it ends."""
    deadline = time.monotonic() + timeout_s
    load = os.getloadavg()[0]
    if load >= limit:
        log(f"waiting for the load average ({load:.2f}) to fall below {limit}")
    while load >= limit and time.monotonic() < deadline:
        time.sleep(5)
        load = os.getloadavg()[0]
    return load
