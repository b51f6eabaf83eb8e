"""`latte deploy k8s` renders what an operator watches: a ServiceMonitor (or PodMonitor), a
PrometheusRule whose thresholds come from each model's SLO, and a Grafana dashboard, each of
which a flag leaves out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from latte.cli import main
from latte.deploy import DeployError, K8sOptions, render_k8s
from latte.deploy import monitoring
from latte.generator.model_folder import write_model

IMAGE = "registry.example.com/ml/latte-triton:0.1.0"


def repository(tmp_path: Path, slo_ms: str = "") -> Path:
    repo = tmp_path / "repo"
    for name in ("ranker", "encoder"):
        write_model(repo, {
            "name": name, "backend": "latte", "max_batch_size": 8,
            "inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
            "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}],
            "dynamic_batching": {"max_queue_delay_microseconds": 100},
            "instance_groups": [{"count": 1, "kind": "KIND_CPU"}],
            "parameters": {"model_file": "model.onnx", "runtime": "onnx",
                           **({"slo_ms": slo_ms} if slo_ms and name == "ranker" else {})},
        }, files={})
    return repo


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_a_deployment_is_rendered_with_its_scrape_monitor_alerts_and_dashboard(tmp_path):
    result = render_k8s(repository(tmp_path, slo_ms="40"), tmp_path / "k8s", K8sOptions(image=IMAGE, slo_ms=250))
    out = tmp_path / "k8s"
    written = {p.relative_to(out).as_posix() for p in result.files}
    assert {"monitoring/servicemonitor.yaml", "monitoring/prometheusrule.yaml",
            "monitoring/dashboard-configmap.yaml", "grafana/dashboard.json"} <= written

    service = load(out / "service.yaml")
    monitor = load(out / "monitoring/servicemonitor.yaml")
    assert monitor["kind"] == "ServiceMonitor"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # Triton's metrics and latte serve's health port, where the supervisor's series are.
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics", "health"]
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}

    rules = {r.get("alert") or r["record"]: r for g in load(out / "monitoring/prometheusrule.yaml")["spec"]["groups"]
             for r in g["rules"]}
    # The ranker's own SLO (40 ms), the encoder's from --slo-ms (250 ms), both in µs.
    assert 'label_replace(vector(40000), "model", "ranker", "", "")' in rules["LatteP95AboveSLO"]["expr"]
    assert 'label_replace(vector(250000), "model", "encoder", "", "")' in rules["LatteP95AboveSLO"]["expr"]
    assert "predict_linear(latte:request_p95_us:rate5m[2h], 21600)" in rules["LatteP95TrendCrossesSLO"]["expr"]
    alerts = [r for r in rules.values() if "alert" in r]
    assert len(alerts) == 9 and all(a["annotations"]["runbook"] for a in alerts)
    assert 'latte_model_restarts_total{reason=~"died|hung"}[10m]' in rules["LatteModelRestarted"]["expr"]
    assert rules["LatteModelGivenUp"]["labels"]["severity"] == "page"

    board = json.loads((out / "grafana/dashboard.json").read_text())
    assert [p["title"] for p in board["panels"]] == [title for title, _, _ in monitoring.PANELS]
    configmap = load(out / "monitoring/dashboard-configmap.yaml")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["latte.json"]) == board
    assert "kubectl apply -f " + str(out / "monitoring") in (out / "README.md").read_text()


def test_each_object_can_be_left_out_and_a_left_out_file_goes(tmp_path):
    repo, out = repository(tmp_path), tmp_path / "k8s"
    render_k8s(repo, out, K8sOptions(image=IMAGE))
    render_k8s(repo, out, K8sOptions(image=IMAGE, pod_monitor=True, alerts=False, dashboard=False))
    assert sorted(p.name for p in (out / "monitoring").iterdir()) == ["podmonitor.yaml"]
    assert not (out / "grafana" / "dashboard.json").exists()
    monitor = load(out / "monitoring/podmonitor.yaml")
    assert monitor["kind"] == "PodMonitor"
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics", "health"]
    # PodMonitor ports are the container's port names.
    (container,) = load(out / "deployment.yaml")["spec"]["template"]["spec"]["containers"]
    assert {"metrics", "health"} <= {p["name"] for p in container["ports"]}
    render_k8s(repo, out, K8sOptions(image=IMAGE, scrape_monitor=False, alerts=False, dashboard=False))
    assert list((out / "monitoring").iterdir()) == []
    assert "monitoring/" not in (out / "README.md").read_text()


def test_the_command_line_takes_the_monitoring_flags(tmp_path, capsys):
    out = tmp_path / "k8s"
    assert main(["deploy", "k8s", str(repository(tmp_path)), "-o", str(out), "--image", IMAGE, "--pod-monitor",
                 "--no-dashboard", "--slo-ms", "80", "--forecast-horizon-h", "3"]) == 0
    rule = load(out / "monitoring/prometheusrule.yaml")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any("predict_linear(latte:request_p95_us:rate5m[2h], 10800)" in e for e in exprs)
    assert any('vector(80000), "model", "encoder"' in e for e in exprs)
    assert (out / "monitoring/podmonitor.yaml").exists() and not (out / "grafana").exists()


@pytest.mark.parametrize("options, message", [
    ({"error_ratio": 1.5}, "--alert-error-ratio is a share of requests, below 1; got 1.5"),
    ({"slo_ms": 0}, "--slo-ms must be a number > 0, got 0"),
    ({"forecast_horizon_h": -1.0}, "--forecast-horizon-h must be a number > 0, got -1.0"),
])
def test_thresholds_that_cannot_alert_are_refused(tmp_path, options, message):
    with pytest.raises(DeployError, match=message.replace("(", r"\(").replace(")", r"\)")):
        render_k8s(repository(tmp_path), tmp_path / "k8s", K8sOptions(image=IMAGE, **options))


def test_a_models_slo_that_is_not_a_number_is_refused_with_the_model_named(tmp_path):
    with pytest.raises(DeployError, match=r"model 'ranker': parameters\[\"slo_ms\"\] must be a number of "
                                          r"milliseconds > 0, got 'soon'"):
        render_k8s(repository(tmp_path, slo_ms="soon"), tmp_path / "k8s", K8sOptions(image=IMAGE))


def test_kserve_gets_rules_and_a_dashboard_but_no_scrape_object_and_a_selector_label_is_added(tmp_path):
    out = tmp_path / "k8s"
    render_k8s(repository(tmp_path), out, K8sOptions(image=IMAGE, kserve=True, monitor_label="release=prom"))
    assert sorted(p.name for p in (out / "monitoring").iterdir()) == ["dashboard-configmap.yaml", "prometheusrule.yaml"]
    assert load(out / "monitoring/prometheusrule.yaml")["metadata"]["labels"]["release"] == "prom"
    with pytest.raises(DeployError, match=r"--monitor-label 'release' must be KEY=VALUE"):
        render_k8s(repository(tmp_path / "again"), out, K8sOptions(image=IMAGE, monitor_label="release"))


def test_a_models_slo_of_zero_is_refused(tmp_path):
    with pytest.raises(DeployError, match=r"parameters\[\"slo_ms\"\] must be a number of milliseconds > 0, got '0'"):
        render_k8s(repository(tmp_path, slo_ms="0"), tmp_path / "k8s", K8sOptions(image=IMAGE))
