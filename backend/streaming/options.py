"""How a streaming model is served: its config's parameters, parsed.

    max_streams          streams running at once (each iteration steps all of them)
    joins_per_iteration  new streams started per iteration at most, so a burst of arrivals
                         does not stall the streams already running
    max_tokens           outputs per stream when a request does not say (vLLM's default: 16)
    cache_blocks         blocks of the cache pool (default: enough for max_streams streams
                         each filling the model's context)
    max_waiting          streams waiting to join; past it a request is refused as overloaded
    cancel_check_ms      how often each running stream asks Triton whether its client gave up
    cancel_checks_per_s  those questions a second at most over the running streams, and as many
                         over the waiting ones: past it each stream asks less often (each costs
                         the server about what a response does)
    response_threads     threads sending responses: each send waits for the server's answer,
                         so several keep several in flight
    min_batch_rows       a batch of fewer rows is padded up to it, so that a stream's outputs do
                         not depend on how many share its batch (invariance.py); auto: measured
                         at load; 1 (the default): never padded, as batching engines run
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from latte.backend.config import _int_param
from latte.backend.errors import ConfigError
from latte.backend.streaming.definition import StreamDefinition


@dataclass(frozen=True)
class StreamOptions:
    max_streams: int = 64
    joins_per_iteration: int = 8
    max_tokens: int = 16
    cache_blocks: int = 0
    max_waiting: int = 4096
    cancel_check_ms: int = 100
    cancel_checks_per_s: int = 100
    response_threads: int = 4
    min_batch_rows: Optional[int] = 1  # None: measured at load (auto)


DEFAULTS = StreamOptions()


def parse_stream_options(name: str, params: Mapping[str, str], definition: StreamDefinition) -> StreamOptions:
    try:
        max_streams = _int_param(params, "max_streams", DEFAULTS.max_streams)
        joins = _int_param(params, "joins_per_iteration", DEFAULTS.joins_per_iteration)
        max_tokens = _int_param(params, "max_tokens", DEFAULTS.max_tokens)
        max_waiting = _int_param(params, "max_waiting", DEFAULTS.max_waiting)
        cancel_ms = _int_param(params, "cancel_check_ms", DEFAULTS.cancel_check_ms)
        checks_per_s = _int_param(params, "cancel_checks_per_s", DEFAULTS.cancel_checks_per_s)
        senders = _int_param(params, "response_threads", DEFAULTS.response_threads)
        asked = params.get("min_batch_rows", "").strip().lower()
        try:
            min_rows = None if asked == "auto" else _int_param(params, "min_batch_rows", DEFAULTS.min_batch_rows)
        except ConfigError:
            raise ConfigError(f"parameters['min_batch_rows'] must be auto or an integer >= 1, got "
                              f"{params['min_batch_rows']!r}") from None
        cache = definition.cache
        whole: Optional[int] = None if cache is None else max_streams * -(-cache.max_tokens // cache.block_tokens)
        blocks = _int_param(params, "cache_blocks", whole) if cache is not None else 0
    except ConfigError as exc:
        raise ConfigError(f"model {name!r}: {exc}") from None
    if min_rows is not None and min_rows > max_streams:
        raise ConfigError(f"model {name!r}: parameters[\"min_batch_rows\"] is {min_rows}, more than max_streams="
                          f"{max_streams}: a batch never holds more streams than that")
    if cache is None and params.get("cache_blocks"):
        raise ConfigError(f"model {name!r}: parameters[\"cache_blocks\"] is set, but {definition.path.name} "
                          "declares no cache")
    return StreamOptions(max_streams=max_streams, joins_per_iteration=joins, max_tokens=max_tokens,
                         cache_blocks=blocks or 0, max_waiting=max_waiting, cancel_check_ms=cancel_ms,
                         cancel_checks_per_s=checks_per_s, response_threads=senders, min_batch_rows=min_rows)
