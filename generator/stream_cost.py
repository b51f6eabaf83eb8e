"""What a streamed output costs on this machine, outside any model: measured on a short-lived
tritonserver with the echo model (a stock decoupled model that only sends the responses it
is asked for), once per machine and kept a week beside the serving cost (calibrate.py).

- response_ms: at ECHO_STREAMS concurrent streams, one response's share of the host, the
  inverse of the echo's outputs per second. Each output a served streaming model makes pays
  it, one after the other with the model's own loop (the bound H of docs/streaming.md).
- first_response_ms: at one stream, a request's first response: the round trip a stream's
  first output pays on top of its start.
- jitter_ms: the echo's inter-token P99 less its P50: the tail this host adds to a stream's
  gaps, with no model computing (other threads, the client on the same cores).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

from latte.generator.calibrate import CalibrationError, kept_per_machine
from latte.generator.stream_profile import ResponseCost

ECHO_STREAMS = 16
ECHO_TOKENS = 32
ECHO_SECONDS = 3.0
ROUND_TRIPS = 20


def measure_response_cost(install=None, log: Callable[[str], None] = lambda line: None) -> ResponseCost:
    """The echo model's responses on a fresh tritonserver (about 10 s)."""
    from latte.bench.streams import measure_streams, warm_streams
    from latte.examples.streams import write_echo_model
    from latte.triton import TritonServer
    from latte.triton.streams import run_streams

    started = time.perf_counter()
    log("calibrating the cost of a streamed response on tritonserver (echo model)")
    with tempfile.TemporaryDirectory(prefix="latte-stream-cost-") as tmp:
        repo = Path(tmp) / "repo"
        write_echo_model(repo, "echo")
        with TritonServer(repo, install=install) as server:
            warm_streams(server.grpc_url, "echo", [b"x"])
            single = run_streams(server.grpc_url, "echo", [b"x"], concurrency=1, max_tokens=1,
                                 per_client=ROUND_TRIPS)
            figures = measure_streams(server.grpc_url, "echo", ECHO_STREAMS, ECHO_SECONDS, ECHO_TOKENS, [b"x"])
    firsts = [r.ttft for r in single if r.ttft is not None]
    if figures.errors or not firsts or figures.tokens_per_s <= 0:
        raise CalibrationError(f"the echo model's streams failed ({figures.errors} errors): cannot measure the "
                               "cost of a response")
    cost = ResponseCost(response_ms=1000.0 / figures.tokens_per_s, first_response_ms=statistics.median(firsts) * 1000,
                        jitter_ms=max(0.0, (figures.itl_p99_ms or 0.0) - (figures.itl_p50_ms or 0.0)),
                        jitter_streams=ECHO_STREAMS)
    log(f"{cost.describe()} ({figures.tokens_per_s:.0f} responses/s at {ECHO_STREAMS} streams; "
        f"{time.perf_counter() - started:.0f} s)")
    return cost


def machine_response_cost(install=None, log: Callable[[str], None] = lambda line: None, refresh: bool = False,
                          cache_dir: Optional[Path] = None) -> ResponseCost:
    """This machine's response cost: kept a week per machine, as the serving cost is."""
    return kept_per_machine("response-cost.json", measure_response_cost, asdict,
                            lambda data: ResponseCost(**data), install, log, refresh, cache_dir,
                            ResponseCost.describe)
