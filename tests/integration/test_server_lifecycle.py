"""Starting and stopping tritonserver, and what a user sees when a model cannot load."""

import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from latte.generator.model_folder import write_model
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


def test_latte_serve_prints_endpoints_stops_on_sigterm_and_says_what_held_the_stop(example_repo, tmp_path):
    """A client that keeps its HTTP connection open holds tritonserver's stop for its exit
    timeout (6 s here): latte serve says so once it has stopped."""
    import http.client

    http_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "latte.cli", "serve", str(example_repo), "--http-port", str(http_port),
         "--grpc-port", str(free_port()), "--metrics-port", str(free_port()), "--log", str(tmp_path / "log"),
         "--", "--exit-timeout-secs=6"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )
    connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=60)
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
        connection.request("GET", "/v2/models/mlp_onnx/ready")  # kept alive, left open
        assert connection.getresponse().status == 200
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        # tritonserver's own code when its exit timeout ran out, then what it waited for
        assert "tritonserver stopped (exit code 1)\n  it waited 6 s for 1 HTTP service connections " \
               "(tritonserver's words)" in out
    finally:
        connection.close()
        if proc.poll() is None:
            proc.kill()


def test_keep_going_serves_the_models_that_load_and_names_the_one_that_did_not(example_repo, tmp_path):
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(example_repo / "mlp_onnx", repo / "mlp_onnx")
    write_model(repo, {"name": "broken", "backend": "latte", "max_batch_size": 4,
                       "inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
                       "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
                       "parameters": {"model_file": "missing.onnx"}}, {})
    http_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "latte.cli", "serve", str(repo), "--keep-going", "--http-port", str(http_port),
         "--grpc-port", str(free_port()), "--metrics-port", str(free_port()), "--log", str(tmp_path / "log"),
         "--", "--exit-timeout-secs=7"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )
    try:
        lines = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("ready") or not line:
                break
        out = "".join(lines)
        assert lines[-1].startswith("ready") and "1 model(s) not served" in lines[-1], out
        assert "not serving broken:" in out and "missing.onnx does not exist" in out
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/mlp_onnx/ready") as r:
            assert r.status == 200
        # The flag after `--` reached tritonserver: its table of options says so.
        assert re.search(r"\| exit_timeout +\| 7 ", (tmp_path / "log").read_text())
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
