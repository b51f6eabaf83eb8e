"""Starting and stopping tritonserver, and what a user sees when a model cannot load."""

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from latte.generator.render import write_model
from latte.triton import ServerStartError, TritonServer
from latte.triton.server import free_port


def test_a_model_that_cannot_load_is_reported_with_the_servers_own_error(tmp_path):
    repo = tmp_path / "repo"
    context = {"name": "broken", "backend": "latte", "max_batch_size": 4,
               "inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
               "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
               "parameters": {"model_file": "missing.onnx"}}
    write_model(repo, context, {})
    with pytest.raises(ServerStartError) as info:
        TritonServer(repo, log_path=tmp_path / "log").start(timeout=120)
    message = str(info.value)
    assert "failed to load 'broken'" in message
    assert "missing.onnx does not exist" in message


def test_latte_serve_prints_endpoints_and_stops_cleanly_on_sigterm(example_repo, tmp_path):
    http_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "latte.cli", "serve", str(example_repo), "--http-port", str(http_port),
         "--grpc-port", str(free_port()), "--metrics-port", str(free_port()), "--log", str(tmp_path / "log")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 180
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("ready") or not line:
                break
        assert lines[-1].startswith("ready"), "".join(lines)
        assert f"http://127.0.0.1:{http_port}" in lines[-1] and "grpc" in lines[-1] and "metrics" in lines[-1]
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/mlp_onnx/ready") as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        assert "tritonserver stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
