"""`latte watch` against a running server: the table names each served model with its figures."""

import subprocess
import sys
import threading

import numpy as np
import pytest

pytestmark = pytest.mark.integration


def test_latte_watch_shows_the_served_models_latency_and_forecast_state(server):
    import tritonclient.grpc as grpcclient

    stop = threading.Event()

    def load():
        client = grpcclient.InferenceServerClient(server.grpc_url)
        rng = np.random.default_rng(1)
        while not stop.is_set():
            x = grpcclient.InferInput("features", [1, 16], "FP32")
            x.set_data_from_numpy(rng.standard_normal((1, 16)).astype(np.float32))
            client.infer("mlp_onnx", [x])

    sender = threading.Thread(target=load, daemon=True)
    sender.start()
    try:
        shown = subprocess.run([sys.executable, "-m", "latte.cli", "watch", server.metrics_url, "--interval", "1.5",
                                "--count", "2", "--slo-ms", "50"], capture_output=True, text=True, timeout=120,
                               env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
    finally:
        stop.set()
        sender.join(timeout=30)
    assert shown.returncode == 0, shown.stderr
    line = next(l for l in shown.stdout.splitlines() if "mlp_onnx" in l)
    cells = [c.strip() for c in line.split("│") if c.strip()]
    assert cells[0] == "mlp_onnx" and float(cells[1].replace(",", "")) > 0     # requests a second
    assert 0 < float(cells[2]) <= float(cells[3]) <= float(cells[4])             # P50 <= P95 <= P99
    assert "samples)" in cells[-1]                                               # too few for a forecast yet
    assert "(SLO 50 ms)" in shown.stdout


def test_latte_watch_says_in_one_line_when_nothing_answers():
    shown = subprocess.run([sys.executable, "-m", "latte.cli", "watch", "127.0.0.1:9", "--count", "1"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode != 0
    assert "cannot read http://127.0.0.1:9/metrics" in shown.stdout + shown.stderr
    assert "Traceback" not in shown.stdout + shown.stderr
