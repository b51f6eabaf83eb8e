"""The rendered rules in a real Prometheus (Debian's package) that scrapes a running `latte serve`:
every rule evaluates without error, the recorded P95 appears for the served model, and with an
SLO below anything a request can meet the P95 alert goes pending for that model and no other.
Without the prometheus binary the test skips and says why."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from latte.deploy import monitoring
from latte.triton.server import free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary: install Debian's prometheus "
                                                            "package (apt-get install prometheus)")]
MODEL = "mlp_onnx"


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def wait_for(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"{what} within {seconds:g} s; last: {last!r}")


@pytest.fixture
def latte_serve(example_repo, tmp_path):
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    proc = subprocess.Popen([sys.executable, "-m", "latte.cli", "serve", str(example_repo),
                             "--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
                             "--metrics-port", str(ports["metrics"]), "--log", str(tmp_path / "triton.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        line = ""
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not line.startswith("ready"):
            line = proc.stdout.readline()
            if not line:
                break
        assert line.startswith("ready"), (tmp_path / "triton.log").read_text()[-2000:]
        yield ports
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def prometheus(latte_serve, tmp_path):
    settings = monitoring.AlertSettings(slo_ms={MODEL: 0.001, "cnn_onnx": 60000.0})
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(monitoring.rules_file(settings), sort_keys=False))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [{"job_name": "latte",
                            "static_configs": [{"targets": [f"127.0.0.1:{latte_serve['metrics']}"]}]}]}))
    port = free_port()
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"), cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: any(t["health"] == "up" for t in get_json(f"{url}/api/v1/targets")["data"]["activeTargets"]),
                 60, "prometheus scraping latte serve")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def send_requests(http_port: int, count: int) -> None:
    rng = np.random.default_rng(0)
    for _ in range(count):
        body = {"inputs": [{"name": "features", "shape": [1, 16], "datatype": "FP32",
                            "data": rng.standard_normal(16).astype(np.float32).tolist()}]}
        request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/infer",
                                         data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200


def test_the_rules_evaluate_on_a_live_latte_serve_and_the_alert_goes_pending(latte_serve, prometheus):
    deadline = time.monotonic() + 90
    pending = []
    while time.monotonic() < deadline and not pending:
        send_requests(latte_serve["http"], 50)
        alerts = get_json(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
        pending = [a for a in alerts if a["labels"]["alertname"] == "LatteP95AboveSLO"]
        time.sleep(1)
    assert [(a["labels"]["model"], a["state"]) for a in pending] == [(MODEL, "pending")]  # `for: 10m` still to run

    p95 = get_json(f"{prometheus}/api/v1/query?query={monitoring.P95_RECORD}")["data"]["result"]
    assert [r["metric"]["model"] for r in p95 if r["value"][1] != "NaN"] == [MODEL]
    groups = get_json(f"{prometheus}/api/v1/rules")["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == len(monitoring.alert_rules(monitoring.ALERT_DEFAULTS)) + len(monitoring.recording_rules())
    assert {r["health"] for r in rules} == {"ok"}, [(r["name"], r.get("lastError")) for r in rules]
    quiet = [r["name"] for r in rules if r.get("type") == "alerting" and r["name"] != "LatteP95AboveSLO"]
    assert [(r["name"], r["state"]) for r in rules if r["name"] in quiet and r["state"] != "inactive"] == []
