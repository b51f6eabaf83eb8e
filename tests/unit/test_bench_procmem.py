"""Process memory from /proc: children found by parent pid, stubs found by name."""

import os
import subprocess
import sys

import pytest

from latte.bench import procmem


def test_descendants_and_rss_of_a_real_process_tree():
    # A child that starts a grandchild, so the walk must go two levels down.
    child = subprocess.Popen([sys.executable, "-c",
                              "import subprocess,sys,time; p=subprocess.Popen([sys.executable,'-c','import time; "
                              "time.sleep(30)']); print(p.pid, flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        grandchild = int(child.stdout.readline())
        found = procmem.descendants(os.getpid())
        assert child.pid in found and grandchild in found
        assert procmem.rss_bytes(child.pid) > 1 << 20
        memory = procmem.server_memory(child.pid)
        assert memory[0].name == "tritonserver" and memory[0].pid == child.pid
        assert procmem.stub_pids(child.pid) == []  # python processes are not stubs
    finally:
        if grandchild:
            os.kill(grandchild, 9)
        child.kill()
        child.wait()


def test_a_port_nobody_listens_on_is_a_lookup_error():
    from latte.triton.server import free_port

    with pytest.raises(LookupError, match="no local tritonserver process listens on port"):
        procmem.find_server_pid(free_port())
