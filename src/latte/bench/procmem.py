"""Resident memory of tritonserver and of its Python backend stub processes, read with psutil.

A process that has ended raises ProcessLookupError (an OSError) here, as reading its /proc
entry would; callers skip it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, TypeVar

import psutil

PROC = Path("/proc")
STUB_NAME = "triton_python_backend_stub"

T = TypeVar("T")


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    name: str
    rss_bytes: int


def os_errors(read: Callable[..., T]) -> Callable[..., T]:
    """psutil's errors as the OSErrors a read of /proc raises: NoSuchProcess as ProcessLookupError
    (a zombie too, for what only a live process has), AccessDenied as PermissionError."""
    @functools.wraps(read)
    def reading(pid: int, *args, **kwargs) -> T:
        try:
            return read(pid, *args, **kwargs)
        except psutil.NoSuchProcess as exc:
            raise ProcessLookupError(f"process {pid} has ended ({exc})") from None
        except psutil.AccessDenied as exc:
            raise PermissionError(f"process {pid} cannot be read ({exc})") from None
    return reading


@os_errors
def rss_bytes(pid: int) -> int:
    """Resident bytes (VmRSS); 0 for a zombie. psutil (/proc/PID/statm) costs 15 µs a call
    against 19 µs for reading /proc/PID/status by hand."""
    return psutil.Process(pid).memory_info().rss


def descendants(root: int) -> List[int]:
    """Every process below `root` (children, grandchildren, ...); none for a root that ended."""
    try:
        return [p.pid for p in psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _is_stub(process: psutil.Process) -> bool:
    """Its name, or its program's as its command line gives it (a stub started under another
    executable keeps the stub's argv[0])."""
    if process.name() in (STUB_NAME, STUB_NAME[:15]):
        return True
    argv = process.cmdline()
    return bool(argv) and os.path.basename(argv[0]) == STUB_NAME


def stub_pids(server_pid: int) -> List[int]:
    """The Python backend stubs of a tritonserver, one per model instance."""
    try:
        below = psutil.Process(server_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    pids = []
    for process in below:
        try:
            if _is_stub(process):
                pids.append(process.pid)
        except psutil.Error:
            continue
    return sorted(pids)


def stub_instance(pid: int) -> str:
    """The model instance a stub serves (its command line carries e.g. mlp_onnx_0_0), or '?'
    (also for a stub that has just ended: they end while a model unloads, between listing and reading)."""
    try:
        args = psutil.Process(pid).cmdline()
    except psutil.Error:
        return "?"
    # argv: stub, model.py, shm region, shm size, shm growth, parent pid, backend dir, ipc size, instance, ...
    return args[8] if len(args) > 8 else "?"


def server_memory(server_pid: int) -> List[ProcessMemory]:
    """RSS of the server followed by each of its stubs; processes that just ended are skipped.

    Stubs are named stub:<pid>:<model instance>.
    """
    result = []
    for pid in [server_pid] + stub_pids(server_pid):
        try:
            name = "tritonserver" if pid == server_pid else f"stub:{pid}:{stub_instance(pid)}"
            result.append(ProcessMemory(pid, name, rss_bytes(pid)))
        except OSError:
            continue
    return result


def find_server_pid(port: int) -> int:
    """The pid of the local tritonserver listening on `port` (for a server started elsewhere).

    Raises LookupError when no tritonserver of this user listens there.
    """
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status != psutil.CONN_LISTEN or connection.laddr.port != port or connection.pid is None:
            continue  # the pid of another user's socket is not given
        try:
            if "tritonserver" in psutil.Process(connection.pid).name():
                return connection.pid
        except psutil.Error:
            continue
    raise LookupError(f"no local tritonserver process listens on port {port}; memory will not be sampled")
