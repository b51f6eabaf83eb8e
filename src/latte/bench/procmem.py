"""Resident memory of tritonserver and of its Python backend stub processes, read from /proc."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

PROC = Path("/proc")
STUB_NAME = "triton_python_backend_stub"


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    name: str
    rss_bytes: int


def _parent_of(pid: int) -> int:
    stat = (PROC / str(pid) / "stat").read_text()
    # The command name is parenthesised and may itself hold spaces or parentheses.
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _name_of(pid: int) -> str:
    return (PROC / str(pid) / "comm").read_text().strip()


def _cmdline_name(pid: int) -> str:
    raw = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")[0]
    return os.path.basename(raw.decode(errors="replace")) or _name_of(pid)


def rss_bytes(pid: int) -> int:
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0  # a zombie has no VmRSS line


def descendants(root: int) -> List[int]:
    """Every live process below `root` (children, grandchildren, ...)."""
    children: Dict[int, List[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            children.setdefault(_parent_of(int(entry.name)), []).append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # the process ended while /proc was read
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stub_pids(server_pid: int) -> List[int]:
    """The Python backend stubs of a tritonserver, one per model instance."""
    pids = []
    for pid in descendants(server_pid):
        try:
            if _name_of(pid) == STUB_NAME[:15] or _cmdline_name(pid) == STUB_NAME:
                pids.append(pid)
        except OSError:
            continue
    return sorted(pids)


def stub_instance(pid: int) -> str:
    """The model instance a stub serves (its command line carries e.g. mlp_onnx_0_0), or '?'
    (also for a stub that has just ended: they end while a model unloads, between listing and reading)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
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
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A = LISTEN
                inodes.add(fields[9])
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if "tritonserver" not in _name_of(int(entry.name)):
                continue
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return int(entry.name)
        except OSError:
            continue
    raise LookupError(f"no local tritonserver process listens on port {port}; memory will not be sampled")
