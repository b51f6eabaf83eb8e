"""CPU time per request: what serving a request costs the machine, split by process.

Throughput on a box whose cores the client, the server and the model share moves by
15-25 % between rounds minutes apart (docs/benchmarks.md). CPU seconds spent per request
move far less: a process is charged only while it runs, so a slow moment of the machine
lengthens the wall clock but not the work. Two contenders that serve the same requests
compare by the CPU each request costs them: the server process (gRPC, Triton's core, the
Python backend's side of the IPC), the model's own stub processes, and the load generator.
"""

from __future__ import annotations

import re
import resource
from dataclasses import dataclass
from typing import Dict, List

import psutil

from latte.bench import procmem


@procmem.os_errors
def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far: /proc/PID/stat's utime
    and stime, through psutil. That costs 18 µs a call against 12 µs for reading the file by
    hand; the supervisor reads it once a second per stub, the benchmarks at a measurement's ends."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def box_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process) since boot:
    /proc/stat's user, nice, system, irq and softirq. Idle and iowait are not work, and neither
    is steal (the hypervisor running another guest on this one's core); guest time is counted
    in user and nice already."""
    times = psutil.cpu_times()
    return times.user + times.nice + times.system + times.irq + times.softirq


def children_cpu_seconds() -> float:
    """CPU seconds of this process's children that have ended and been waited for (the load
    generator, once its run is over)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def model_stub_pids(server_pid: int, model: str) -> List[int]:
    """The stubs serving `model`'s instances (their instance names are MODEL_<group>_<n>)."""
    pattern = re.compile(rf"{re.escape(model)}_\d+_\d+")
    return [pid for pid in procmem.stub_pids(server_pid) if pattern.fullmatch(procmem.stub_instance(pid))]


@dataclass(frozen=True)
class CpuSample:
    server: float
    stubs: float
    client: float

    def minus(self, before: "CpuSample") -> "CpuSample":
        return CpuSample(self.server - before.server, self.stubs - before.stubs, self.client - before.client)


def sample(server_pid: int, stub_pids: List[int]) -> CpuSample:
    stubs = 0.0
    for pid in stub_pids:
        try:
            stubs += process_cpu_seconds(pid)
        except OSError:  # a stub that ended is charged nothing more
            continue
    return CpuSample(process_cpu_seconds(server_pid), stubs, children_cpu_seconds())


def per_request_us(used: CpuSample, requests: int) -> Dict[str, float]:
    """µs of CPU per request in each process class and in all of them."""
    if requests <= 0:
        raise ValueError(f"no requests were served while CPU time was measured ({requests})")
    scale = 1e6 / requests
    figures = {"server": used.server * scale, "stub": used.stubs * scale, "client": used.client * scale}
    figures["total"] = figures["server"] + figures["stub"] + figures["client"]
    return figures
