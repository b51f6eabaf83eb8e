"""Load from tritonclient directly: closed loop with bounded in-flight requests, or open-loop Poisson.

Every request sent is accounted for: its callback records exactly one outcome (success with
its latency, or the error message), so a run can prove that each request got one answer.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np


def grpc_inputs(feed: Dict[str, np.ndarray]):
    import tritonclient.grpc as grpcclient

    from latte.triton.client import infer_inputs

    return infer_inputs(grpcclient, feed)


@dataclass
class Outcomes:
    """Results of one class of requests (e.g. one priority), safe to update from callbacks."""
    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    latencies_ms: List[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_sent(self) -> None:
        with self.lock:
            self.sent += 1

    def record(self, latency_ms: float, error: Optional[str]) -> None:
        with self.lock:
            if error is None:
                self.succeeded += 1
                self.latencies_ms.append(latency_ms)
            else:
                self.failed += 1
                self.errors[error] += 1

    @property
    def answered(self) -> int:
        with self.lock:
            return self.succeeded + self.failed

    def take_latencies(self) -> List[float]:
        """The latencies recorded since the last call (for per-window statistics)."""
        with self.lock:
            taken, self.latencies_ms = self.latencies_ms, []
            return taken


def error_kind(message: str) -> str:
    """Error messages without their varying parts, so that counts group by cause."""
    text = str(message)
    for marker in ("Exceeds maximum queue size", "Request timeout expired", "Deadline Exceeded",
                   "Socket closed", "failed to connect", "UNAVAILABLE"):
        if marker.lower() in text.lower():
            return marker
    return text.splitlines()[0][:160]


def percentile(values: List[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


class AsyncSender:
    """Sends gRPC requests asynchronously; `limit` bounds how many are in flight at once."""

    def __init__(self, grpc_url: str, model: str, limit: int) -> None:
        import tritonclient.grpc as grpcclient

        if limit < 1:
            raise ValueError(f"the in-flight limit must be >= 1, got {limit}")
        self.client = grpcclient.InferenceServerClient(grpc_url)
        self.model = model
        self.slots = threading.BoundedSemaphore(limit)
        self._in_flight = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)

    def send(self, feed: Dict[str, np.ndarray], outcomes: Outcomes, priority: int = 0,
             timeout_us: Optional[int] = None, block: bool = True) -> bool:
        """Send one request; False (nothing sent) when `block` is False and no slot is free."""
        if not self.slots.acquire(blocking=block):
            return False
        with self._lock:
            self._in_flight += 1
        outcomes.count_sent()
        started = time.perf_counter()

        def done(result, error) -> None:
            outcomes.record((time.perf_counter() - started) * 1000, None if error is None else error_kind(error))
            self.slots.release()
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.notify_all()

        try:
            self.client.async_infer(self.model, grpc_inputs(feed), callback=done, priority=priority,
                                    timeout=timeout_us)
        except Exception as exc:  # the request never left: it is answered here, once
            done(None, exc)
        return True

    def drain(self, timeout: float) -> bool:
        """Wait until every request sent has been answered; False if some are still out."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def close(self) -> None:
        self.client.close()


def poisson_schedule(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Send times (seconds from the start) of a Poisson process of `rate` per second."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError(f"need rate > 0 and duration > 0, got {rate}, {duration_s}")
    gaps = rng.exponential(1.0 / rate, size=int(rate * duration_s * 1.3) + 16)
    times = np.cumsum(gaps)
    return times[times < duration_s]


def run_open_loop(times: np.ndarray, send: Callable[[int], None]) -> float:
    """Call send(i) at each scheduled time; returns how late the sender fell behind at most (s)."""
    start = time.perf_counter()
    worst_lag = 0.0
    for i, at in enumerate(times):
        delay = at - (time.perf_counter() - start)
        if delay > 0:
            time.sleep(delay)
        else:
            worst_lag = max(worst_lag, -delay)
        send(i)
    return worst_lag
