"""Per-request options carried in Triton request parameters.

    priority_level int >= 0, higher runs first (default 0); "priority" itself is reserved by
                   Triton for its own queue priority, which the dynamic batcher applies first
    timeout_ms     the request fails instead of running once it has waited this long; without
                   it, Triton's own request timeout (the client's `timeout`, in us) applies
    session_id     string; the request continues that session's state
    session_start  bool; create the session (an unknown session is otherwise an error)
    session_end    bool; drop the session's state after this request
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional

from latte._native import PRIORITY_LEVELS
from latte.backend.errors import RequestError

# The highest priority_level: the scheduler's, so inline and lane execution order alike.
MAX_PRIORITY = PRIORITY_LEVELS - 1


@dataclass(frozen=True)
class RequestOptions:
    priority: int = 0
    timeout_ms: Optional[float] = None
    session_id: Optional[str] = None
    session_start: bool = False
    session_end: bool = False


# What a request without parameters or a timeout runs with; shared, since options are frozen.
DEFAULT_OPTIONS = RequestOptions()


def _bool(params: Mapping, key: str) -> bool:
    value = params.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise RequestError(f"parameter {key!r} must be a boolean, got {value!r}")


def read_options(params: Mapping[str, object], max_priority: int = MAX_PRIORITY, triton_timeout_us: int = 0) -> RequestOptions:
    if not params and triton_timeout_us <= 0:
        return DEFAULT_OPTIONS
    priority = params.get("priority_level", 0)
    if isinstance(priority, str):
        try:
            priority = int(priority.strip())
        except ValueError:
            pass  # refused below, in the request's own words
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= max_priority:
        raise RequestError(f"parameter 'priority_level' must be an integer from 0 to {max_priority}, got {priority!r}")
    timeout = params.get("timeout_ms")
    if timeout is None and triton_timeout_us > 0:
        timeout = triton_timeout_us / 1000.0
    if timeout is not None:
        try:
            timeout = float(timeout)
        except (TypeError, ValueError):
            raise RequestError(f"parameter 'timeout_ms' must be a number of milliseconds, got {timeout!r}") from None
        if not timeout > 0:
            raise RequestError(f"parameter 'timeout_ms' must be > 0, got {timeout}")
    session = params.get("session_id")
    if session is not None:
        session = str(session)
        if not session or len(session) > 256:
            raise RequestError("parameter 'session_id' must be a non-empty string of at most 256 characters")
    start, end = _bool(params, "session_start"), _bool(params, "session_end")
    if (start or end) and session is None:
        raise RequestError("session_start / session_end need a session_id")
    return RequestOptions(priority=priority, timeout_ms=timeout, session_id=session,
                          session_start=start, session_end=end)


def call_options(items: List) -> Optional[List[Optional[RequestOptions]]]:
    """Each readable request's options (`read_options`; one that sends no parameters shares
    the defaults); a request whose parameters are wrong becomes its RequestError in `items`,
    its options None. None when no request carries a parameter or a timeout: every request
    runs with the defaults."""
    for item in items:
        if not isinstance(item, Exception) and (item.parameters or item.timeout_us > 0):
            break
    else:
        return None
    options: List[Optional[RequestOptions]] = []
    for i, item in enumerate(items):
        if isinstance(item, Exception):
            options.append(None)
            continue
        try:
            options.append(read_options(item.parameters, triton_timeout_us=item.timeout_us))
        except RequestError as exc:
            items[i] = exc
            options.append(None)
    return options
