"""Start, watch and stop a real tritonserver process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from latte.triton.backend_dir import install_backend
from latte.triton.security import ADMIN_HEADER, restricted_api_args
from latte.triton.cache import cache_bytes_for, cache_directory_flags, cache_flag
from latte.triton.locate import TritonInstall, find_triton


class ServerStartError(RuntimeError):
    """tritonserver exited or never became ready; the message carries its error lines."""


def default_backend_directory() -> Path:
    # Tied to the interpreter: the stub copied there must match its Python version.
    return Path(sys.prefix) / "share" / "latte" / "backends"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Lines of a Triton log that explain a failed start (model load errors, bad flags).
_ERROR_LINE = re.compile(r"^E\d{4} |error:|failed to load|UNAVAILABLE|Traceback|Error", re.IGNORECASE)


def error_lines(log: str, limit: int = 20) -> List[str]:
    lines = [line for line in log.splitlines() if _ERROR_LINE.search(line)]
    return lines[-limit:]


# tritonserver's countdown as it stops, once a second until what it waits for is gone or its
# exit timeout (--exit-timeout-secs, 30 s by default) has passed:
#   "Timeout 27: Found 1 HTTP service connections"
#   "Timeout 27: Found 2 live models and 0 in-flight non-inference requests"
_COUNTDOWN = re.compile(r'Timeout (\d+): Found (\d+) ([^"\n]+)')  # quoted by 2.51, not by older releases
# Unloading the models of a repository takes a second or two: a wait this long is no longer that.
STOP_WAIT_S = 5
# The end of the log a stop's countdown is read from: 30 lines of each thing waited for, with
# room for the lines of models unloading meanwhile.
STOP_LOG_TAIL_BYTES = 1 << 20


def stop_waits(log: str, longer_than_s: int = STOP_WAIT_S) -> List[Tuple[str, int]]:
    """What held tritonserver's stop for more than `longer_than_s` seconds, in its log's
    words with the last count it printed, and for how many seconds: an HTTP client that kept
    its connection open, say, or a model that would not unload."""
    seen = {}  # what -> (first countdown value, last countdown value, last count)
    for match in _COUNTDOWN.finditer(log):
        left, count, what = int(match.group(1)), int(match.group(2)), match.group(3).strip()
        if count:
            first = seen.get(what, (left,))[0]
            seen[what] = (first, left, count)
    return [(f"{count} {what}", first - last + 1) for what, (first, last, count) in seen.items()
            if first - last + 1 > longer_than_s]


_LIVE_MODELS = re.compile(r"Found (\d+) live models and 0 in-flight non-inference requests")


def only_stuck_models_left(log_tail: str, stuck_models: int) -> bool:
    """Whether the stop's last countdown line counts no more live models than are stuck."""
    counts = _LIVE_MODELS.findall(log_tail)
    return bool(counts) and int(counts[-1]) <= stuck_models


class TritonServer:
    """A tritonserver serving one model repository on loopback ports.

    >>> with TritonServer("repo") as server:
    ...     print(server.http_url, server.grpc_url)
    """

    def __init__(
        self,
        repository: os.PathLike,
        install: Optional[TritonInstall] = None,
        backend_directory: Optional[os.PathLike] = None,
        http_port: Optional[int] = None,
        grpc_port: Optional[int] = None,
        metrics_port: Optional[int] = None,
        log_path: Optional[os.PathLike] = None,
        extra_args: Sequence[str] = (),
        log_verbose: int = 0,
        keep_going: bool = False,
        response_cache_bytes: Optional[int] = None,
        address: str = "127.0.0.1",
        admin_token: Optional[str] = None,
        environment: Optional[Mapping[str, str]] = None,
    ) -> None:
        # An object store's location (s3://, gs://, as://) goes to tritonserver as it is.
        remote = "://" in str(repository)
        self.repository = str(repository) if remote else Path(repository).resolve()
        if not remote and not self.repository.is_dir():
            raise FileNotFoundError(f"model repository {self.repository} does not exist")
        self.install = install or find_triton()
        self.backend_directory = Path(backend_directory or default_backend_directory())
        self.http_port = http_port or free_port()
        self.grpc_port = grpc_port or free_port()
        self.metrics_port = metrics_port or free_port()
        self._log_path = Path(log_path) if log_path else None
        self.extra_args = list(extra_args)
        self.log_verbose = log_verbose
        # Serve the models that load when others fail (listed by failed_models()).
        self.keep_going = keep_going
        # None: a cache of the default size when a model of the repository enables response_cache; 0: none.
        self.response_cache_bytes = (cache_bytes_for(self.repository, response_cache_bytes) if not remote
                                     else int(response_cache_bytes or 0))
        self.process: Optional[subprocess.Popen] = None
        # What held the last stop up (stop_waits), once it is over.
        self.stop_waited: List[Tuple[str, int]] = []
        # Where HTTP, gRPC and metrics listen; with admin_token, Triton's administrative APIs
        # (security.ADMIN_APIS) answer only requests that carry it (security.ADMIN_HEADER).
        self.address = address
        self.admin_token = admin_token
        # What this process connects to: the address itself, or this machine for a wildcard.
        self._host = "127.0.0.1" if address in ("0.0.0.0", "::") else address
        # Variables the server and its models' processes get on top of the install's.
        self.environment = dict(environment or {})

    @property
    def log_path(self) -> Path:
        """The server's log file: the one given, or a temporary file made when first asked for
        (a server only inspected, never started, leaves none behind)."""
        if self._log_path is None:
            handle, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(handle)
            self._log_path = Path(name)
        return self._log_path

    @property
    def http_url(self) -> str:
        return f"{self._host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self._host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._host}:{self.metrics_port}/metrics"

    def command(self) -> List[str]:
        return [
            str(self.install.server),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.backend_directory}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            f"--http-address={self.address}",
            f"--grpc-address={self.address}",
            *(restricted_api_args(self.admin_token) if self.admin_token else []),
            # By default a model that fails to load stops the server, so the failure is reported,
            # not hidden; with keep_going the rest is served and the failures are listed.
            f"--exit-on-error={'false' if self.keep_going else 'true'}",
            f"--strict-readiness={'false' if self.keep_going else 'true'}",
            f"--log-verbose={self.log_verbose}",
            *([*cache_directory_flags(self.install.server), cache_flag(self.response_cache_bytes)]
              if self.response_cache_bytes else []),
            *self.extra_args,
        ]

    def log(self, last_bytes: Optional[int] = None) -> str:
        """The server's log, or its last `last_bytes` bytes."""
        try:
            with open(self.log_path, "rb") as log:
                if last_bytes is not None:
                    log.seek(max(0, log.seek(0, os.SEEK_END) - last_bytes))
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self, timeout: float = 120.0, fresh_log: bool = True) -> "TritonServer":
        """Start tritonserver and wait until it is ready; `fresh_log=False` (a restart) keeps the
        log of the run before, whose end says why it stopped."""
        install_backend(self.backend_directory, self.install)
        # Appending: others (the supervisor) add lines to the same log while the server writes.
        if fresh_log:
            open(self.log_path, "wb").close()
        log = open(self.log_path, "ab")
        # Own process group: the Python backend's stub processes go down with the server.
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT,
            env={**self.install.environment(), **self.environment}, start_new_session=True,
            # Not the caller's folder: the stub puts its working directory first on
            # sys.path, where a source checkout would shadow the installed package.
            cwd=str(self.log_path.parent),
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise ServerStartError(self._failure(f"tritonserver exited with code {code}"))
            # Triton opens its metrics port after the HTTP one: a caller scraping right after
            # readiness would find it closed.
            if self.is_ready() and self._metrics_serving():
                return self
            time.sleep(0.1)
        self.stop()
        raise ServerStartError(self._failure(f"tritonserver was not ready after {timeout:.0f} s"))

    def _failure(self, headline: str) -> str:
        lines = error_lines(self.log())
        detail = "\n  ".join(lines) if lines else "(no error lines; see the log)"
        return f"{headline}; log: {self.log_path}\n  {detail}"

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=1.0) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _metrics_serving(self) -> bool:
        if "--allow-metrics=false" in self.extra_args:
            return True
        try:
            with socket.create_connection((self._host, self.metrics_port), timeout=1.0):
                return True
        except OSError:
            return False

    def failed_models(self) -> List[Tuple[str, str]]:
        """(model, reason) for every model of the repository that is not ready, from Triton's
        repository index."""
        request = urllib.request.Request(f"http://{self.http_url}/v2/repository/index", data=b"{}", method="POST",
                                         headers=self.admin_headers())
        with urllib.request.urlopen(request, timeout=5.0) as r:
            index = json.loads(r.read().decode("utf-8"))
        return [(entry["name"], entry.get("reason", "") or entry.get("state", "not ready"))
                for entry in index if entry.get("state") != "READY"]

    def admin_headers(self) -> dict:
        """The header Triton's administrative APIs want from this server's callers (none if open)."""
        return {ADMIN_HEADER: self.admin_token} if self.admin_token else {}

    def append_log(self, line: str) -> None:
        """Add a line of latte's own to the server's log, beside tritonserver's."""
        with open(self.log_path, "ab") as log:
            log.write((line.rstrip("\n") + "\n").encode())

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = 30.0, stuck_models: int = 0) -> Optional[int]:
        """SIGTERM, then SIGKILL after `grace` seconds; or as soon as tritonserver waits on no
        more than `stuck_models` live models and nothing in flight: copies whose process died,
        which Triton 2.51 never finishes unloading (docs/reliability.md)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.process.poll() is None and time.monotonic() < deadline:
                if stuck_models and only_stuck_models_left(self.log(last_bytes=4096), stuck_models):
                    break
                time.sleep(0.2)
        # Whatever is left of the group (a stub that ignored the shutdown) is killed.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = self.process.wait()
        # The countdown is at the end of the log, which a long-running server may have made large.
        self.stop_waited = stop_waits(self.log(last_bytes=STOP_LOG_TAIL_BYTES))
        return code

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
