"""Where a run sends its load: a tritonserver it starts itself, or one already running."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from latte.bench import procmem


@dataclass(frozen=True)
class Target:
    http_url: str                 # host:port
    grpc_url: Optional[str]       # host:port
    metrics_url: Optional[str]    # full URL of the Prometheus endpoint
    server_pid: Optional[int]     # None when the server runs on another machine
    started_here: bool
    log_path: Optional[Path] = None

    def url_for(self, protocol: str) -> str:
        if protocol == "grpc":
            if not self.grpc_url:
                raise ValueError("--protocol grpc needs --grpc-url when --url names a running server")
            return self.grpc_url
        if protocol == "http":
            return self.http_url
        raise ValueError(f"protocol must be grpc or http, got {protocol!r}")


@contextlib.contextmanager
def start_or_attach(repo: Optional[Path], url: Optional[str] = None, grpc_url: Optional[str] = None,
                    metrics_url: Optional[str] = None, log_path: Optional[Path] = None,
                    extra_args: Sequence[str] = ()) -> Iterator[Target]:
    """Start tritonserver on `repo` (default) or attach to the server at `url`."""
    if url:
        pid = None
        host, _, port = url.rpartition(":")
        if host in ("127.0.0.1", "localhost", "0.0.0.0") and port.isdigit():
            try:
                pid = procmem.find_server_pid(int(port))
            except LookupError:
                pid = None
        yield Target(url, grpc_url, metrics_url, pid, started_here=False)
        return
    if repo is None:
        raise ValueError("give a model repository to serve, or --url of a running tritonserver")
    from latte.triton import TritonServer

    with TritonServer(repo, log_path=log_path, extra_args=extra_args) as server:
        yield Target(server.http_url, server.grpc_url, server.metrics_url, server.process.pid,
                     started_here=True, log_path=server.log_path)
