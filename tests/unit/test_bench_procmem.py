"""Process memory (psutil): children found by parent pid, stubs found by name."""

import os
import subprocess
import sys

import pytest

from latte.bench import cpu, procmem


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


def test_the_server_is_found_by_the_port_it_listens_on_and_a_port_nobody_listens_on_is_a_lookup_error(tmp_path):
    from latte.triton.server import free_port

    port = free_port()
    with pytest.raises(LookupError, match="no local tritonserver process listens on port"):
        procmem.find_server_pid(port)
    (tmp_path / "tritonserver").symlink_to(sys.executable)  # a process named tritonserver
    server = subprocess.Popen([str(tmp_path / "tritonserver"), "-c",
                               f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen();"
                               " print(flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()  # listening
        assert procmem.find_server_pid(port) == server.pid
    finally:
        server.kill()
        server.wait()


def test_a_stub_is_found_below_its_server_by_its_program_name(tmp_path):
    # A stub's arguments: its own path, the model's file, ..., the instance's name the eighth.
    model_file = tmp_path / "mlp_onnx" / "1" / "model.py"
    model_file.parent.mkdir(parents=True)
    model_file.write_text("import time\ntime.sleep(30)\n")
    argv = [f"/opt/tritonserver/backends/python/{procmem.STUB_NAME}", str(model_file),
            "shm", "1048576", "1048576", "1", "/opt/tritonserver/backends/python", "0", "mlp_onnx_0_1"]
    # A process of its own stands for the server: below the test's own process, the stubs of
    # servers other tests started may still run.
    server = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               f"stub = subprocess.Popen({argv!r}, executable=sys.executable)\n"
                               "print(stub.pid, flush=True)\ntime.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        stub_pid = int(server.stdout.readline())
        assert procmem.stub_pids(server.pid) == [stub_pid]
        assert procmem.stub_instance(stub_pid) == "mlp_onnx_0_1"
        assert cpu.model_stub_pids(server.pid, "mlp_onnx") == [stub_pid]
        assert cpu.model_stub_pids(server.pid, "mlp") == []
        memory = procmem.server_memory(server.pid)
        assert [m.name for m in memory] == ["tritonserver", f"stub:{stub_pid}:mlp_onnx_0_1"]
    finally:
        for process in procmem.descendants(server.pid):
            os.kill(process, 9)
        server.kill()
        server.wait()


def test_a_zombie_holds_no_memory_and_a_process_gone_is_an_os_error():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)   # ended, not yet reaped: a zombie
    assert procmem.rss_bytes(child.pid) == 0
    child.wait()
    with pytest.raises(ProcessLookupError):
        procmem.rss_bytes(child.pid)
    with pytest.raises(ProcessLookupError):
        cpu.process_cpu_seconds(child.pid)
    assert procmem.descendants(child.pid) == [] and procmem.stub_pids(child.pid) == []
    assert procmem.stub_instance(child.pid) == "?"
