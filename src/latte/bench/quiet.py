"""Waiting for a quiet machine before a measurement: the 1-minute load average below a limit."""

from __future__ import annotations

import os
import time
from typing import Callable

QUIET_LOAD = 0.5


def wait_until_quiet(limit: float = QUIET_LOAD, timeout_s: float | None = None,
                     log: Callable[[str], None] = lambda line: None) -> float:
    """Sleep until the 1-minute load average is below `limit` (at most `timeout_s`, by default
    LATTE_QUIET_WAIT_S or 300 s); the load average then. A run of several parts calls it before
    each, since the part before loads the machine for a minute after it ends. A run on a lent
    machine, whose minutes are counted, sets LATTE_QUIET_WAIT_S=0 and reports the load it found."""
    if timeout_s is None:
        timeout_s = float(os.environ.get("LATTE_QUIET_WAIT_S", "300"))
    deadline = time.monotonic() + timeout_s
    load = os.getloadavg()[0]
    if load >= limit and timeout_s > 0:
        log(f"waiting for the load average ({load:.2f}) to fall below {limit}")
    while load >= limit and time.monotonic() < deadline:
        time.sleep(5)
        load = os.getloadavg()[0]
    return load
