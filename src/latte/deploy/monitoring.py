"""What an operator watches: the scrape object, the alert rules and the dashboard, rendered
beside the Deployment by `latte deploy k8s` (docs/scale-out.md, "Watching it").

    OUT/monitoring/servicemonitor.yaml   (podmonitor.yaml with --pod-monitor)  the Prometheus Operator scrapes the pods
    OUT/monitoring/prometheusrule.yaml   the alerts, each with a runbook line
    OUT/monitoring/dashboard.json        the Grafana dashboard
    OUT/monitoring/dashboard-configmap.yaml  the same, labelled for Grafana's sidecar

Thresholds come from each model's SLO (its config's `slo_ms` parameter, written by `latte
generate`, or --slo-ms) and the options below, whose defaults are stated in ALERT_DEFAULTS.
The monitors scrape two ports of each pod: Triton's metrics port (nv_* and the models' latte_*
series) and `latte serve`'s health port (the supervisor's latte_model_* series, latte_models_down).
Every expression here is PromQL over latte's and Triton's own series; the tests parse each one
with promtool and make each alert fire, and stay quiet, with `promtool test rules`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, List, Sequence

# The label every latte series carries for its model.
MODEL = "model"
P95_RECORD = "latte:request_p95_us:rate5m"
ERROR_RATIO_RECORD = "latte:request_error_ratio:rate5m"
GRAFANA_SIDECAR_LABEL = ("grafana_dashboard", "1")
# The container ports a ServiceMonitor or PodMonitor scrapes (k8s.PORTS, by name).
SCRAPED_PORTS = ("metrics", "health")
# Where an operator sends the admin header (latte-admin-key) to load a model again by hand.
LOAD_CALL = "POST /v2/repository/models/{{ $labels.model }}/load"


@dataclass(frozen=True)
class AlertSettings:
    """What the alerts hold each model to."""
    slo_ms: Dict[str, float]                 # model -> its P95 bound
    forecast_horizon_h: float = 6.0          # how far ahead the trend alert looks
    trend_window_h: float = 2.0              # the history predict_linear fits
    error_ratio: float = 0.01                # failed requests / all, over 5 minutes
    rss_growth_mib_per_h: float = 256.0      # a pod's resident memory growth per hour
    runbook_url: str = "docs/scale-out.md#watching-it"


ALERT_DEFAULTS = AlertSettings(slo_ms={})
DEFAULT_SLO_MS = 100.0


def _slo_us(settings: AlertSettings) -> str:
    """A PromQL vector of each model's SLO in µs, matched on `model` (a model without one has no
    latency alert): `label_replace(vector(100000), "model", "m", "", "")` or ...."""
    parts = [f'label_replace(vector({ms * 1000:g}), "{MODEL}", "{name}", "", "")'
             for name, ms in sorted(settings.slo_ms.items())]
    return " or ".join(parts) if parts else "vector(0) < 0"


# Outcomes that are the server's failures: a client's bad request or cancellation is not, and
# requests refused for a full queue (or while shutting down) have their own alert.
SERVER_FAILURES = 'outcome!~"success|bad_request|cancelled|overloaded"'
BY = f"namespace, {MODEL}"


def recording_rules() -> List[Dict]:
    return [
        # Recorded only while requests flow: an idle model's NaN would blind predict_linear for hours.
        {"record": P95_RECORD,
         "expr": (f"histogram_quantile(0.95, sum by ({BY}, le) (rate(latte_request_duration_us_bucket[5m]))) "
                  f"and on ({BY}) sum by ({BY}) (rate(latte_request_duration_us_count[5m])) > 0")},
        {"record": ERROR_RATIO_RECORD,
         "expr": (f"sum by ({BY}) (rate(latte_requests_total{{{SERVER_FAILURES}}}[5m])) "
                  f"/ clamp_min(sum by ({BY}) (rate(latte_requests_total[5m])), 1e-9)")},
    ]


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, runbook: str, url: str) -> Dict:
    alert = {"alert": name, "expr": expr, "labels": {"severity": severity},
             "annotations": {"summary": summary, "runbook": runbook, "runbook_url": url}}
    if for_:
        alert["for"] = for_
    return alert


def alert_rules(s: AlertSettings) -> List[Dict]:
    slo = _slo_us(s)
    horizon_s = int(s.forecast_horizon_h * 3600)
    window = f"{s.trend_window_h:g}h"
    on = f"on ({MODEL}) group_left()"
    return [
        _alert("LatteP95AboveSLO", f"{P95_RECORD} > {on} ({slo})", "10m", "page",
               "{{ $labels.model }}: P95 above its SLO for 10 minutes",
               "Add replicas (or raise --max-replicas); if the queue is short, the model itself slowed: "
               "look at per-step time and the fragmentation alarm.", s.runbook_url),
        _alert("LatteP95TrendCrossesSLO",
               f"(predict_linear({P95_RECORD}[{window}], {horizon_s}) > {on} ({slo})) "
               f"and ({P95_RECORD} <= {on} ({slo}))", "15m", "warn",
               f"{{{{ $labels.model }}}}: P95 is projected to cross its SLO within {s.forecast_horizon_h:g} h",
               "Latency grows with uptime. latte reloads the model itself, without failing a request, once its "
               "P99 stays above health_p99_slo_ms for health_p99_window_s (latte_model_restarts_total "
               "reason=rejuvenated). If the trend survives those reloads, find what grows (RSS, arena held "
               "bytes, sessions).", s.runbook_url),
        _alert("LatteArenaFragmented", "max by (model, pod) (latte_arena_fragmented) == 1", "5m", "warn",
               "{{ $labels.model }}: the arena's free bytes fit the P99 request but no free block does",
               "Requests will start failing with memory free. latte reloads the model itself (a fresh arena, no "
               "failed request) once the alarm has held for health_fragmented_s (default 300 s); if it comes "
               f"back, raise arena_bytes. By hand: {LOAD_CALL} with the admin header, not a pod restart.",
               s.runbook_url),
        _alert("LatteArenaFragmentationFailures",
               'sum by (model, pod) (delta(latte_arena_failures{kind="fragmentation"}[10m])) > 0', "",
               "page", "{{ $labels.model }}: requests failed for want of a contiguous block with memory free",
               "latte's reload of a fragmented arena may be under way (latte_model_restarts_total "
               f"reason=rejuvenated); if failures go on, load the model again now ({LOAD_CALL} with the admin "
               "header: a fresh arena, the pod's other models untouched); then raise arena_bytes (docs/memory.md).",
               s.runbook_url),
        _alert("LatteQueueSaturated",
               f'sum by ({BY}) (rate(latte_requests_total{{outcome="overloaded"}}[5m])) > 0',
               "5m", "page", "{{ $labels.model }}: requests refused for a full queue",
               "Add replicas; a burst longer than max_queue_size can hold is being shed, lowest priority first.",
               s.runbook_url),
        _alert("LatteResidentMemoryGrowing",
               # Against the value an hour ago, which a pod younger than an hour lacks: its warm-up
               # is not growth.
               f"latte_resident_memory_bytes - latte_resident_memory_bytes offset 1h "
               f"> {s.rss_growth_mib_per_h * 2 ** 20:g}", "30m",
               "warn", f"{{{{ $labels.model }}}} on {{{{ $labels.pod }}}}: resident memory grows faster than "
               f"{s.rss_growth_mib_per_h:g} MiB/h",
               "A leak or a growing cache: compare arena and session figures. With the model parameter "
               "health_rss_growth_mib_per_min latte reloads the model itself when it grows faster (reason="
               f"rejuvenated); without it, load the model again ({LOAD_CALL} with the admin header) before "
               "the pod's memory limit, and set the parameter.", s.runbook_url),
        _alert("LatteRequestsFailing", f"{ERROR_RATIO_RECORD} > {s.error_ratio:g}", "5m", "page",
               f"{{{{ $labels.model }}}}: more than {s.error_ratio:.0%} of requests fail on the server",
               "Read the errors by reason on the dashboard: model_error is the model's, out_of_memory the "
               "arena's, timeout a queue that waits too long.", s.runbook_url),
        # The supervisor's series (latte serve's health port), one per pod.
        _alert("LatteModelRestarted",
               f'sum by ({BY}, pod, reason) (increase(latte_model_restarts_total{{reason=~"died|hung"}}[10m])) > 0',
               "", "warn", "{{ $labels.model }} on {{ $labels.pod }}: latte restarted the model, whose process "
                           "{{ $labels.reason }}",
               "Already done by latte: it noticed the death within a second (a hang after execute_timeout_s), "
               "loaded the model again, answered the requests in flight with an error, and journaled their "
               "inputs; an input in flight at two crashes is refused from then on. Left to you: read the pod's "
               "log line for this restart (the signal or exit code, or the execute that hung) and fix the model "
               "or the input it names. No restart of the pod is needed.", s.runbook_url),
        # A model given up fails the pod's liveness probe, so the kubelet restarts the container
        # within about 30 s and the gauge drops back: the look-back keeps that from slipping
        # between two evaluations.
        _alert("LatteModelGivenUp", f"max by ({BY}, pod) (max_over_time(latte_model_given_up[10m])) == 1", "",
               "page", "{{ $labels.model }} on {{ $labels.pod }}: latte gave the model up after too many "
                       "restarts",
               "Already done by latte: it restarted the model --max-restarts times within --restart-window, "
               "each death noticed within a second, its requests in flight answered with an error and their "
               "inputs journaled (an input that crashed it twice is refused); then it stopped, marked the pod "
               "not ready and not live, and the kubelet restarts its container, whose state folder keeps the "
               "refused inputs. Left to you: read the pod's log lines with the signal or exit code, fix the "
               f"model or its input, and load it again ({LOAD_CALL} with the admin header). Restarting the pod "
               "is not the first step.", s.runbook_url),
    ]


def prometheus_rule(name: str, namespace: str, labels: Dict[str, str], s: AlertSettings) -> Dict:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": _metadata(f"{name}-alerts", namespace, labels),
            "spec": {"groups": [{"name": f"{name}.records", "rules": recording_rules()},
                                {"name": f"{name}.alerts", "rules": alert_rules(s)}]}}


def rules_file(s: AlertSettings, name: str = "latte") -> Dict:
    """The same groups as a plain Prometheus rules file (what promtool and a Prometheus without
    the Operator read)."""
    return {"groups": prometheus_rule(name, "", {}, s)["spec"]["groups"]}


def scrape_monitor(name: str, namespace: str, labels: Dict[str, str], selector: Dict[str, str],
                   pod_monitor: bool) -> Dict:
    endpoints = [{"port": port, "path": "/metrics", "interval": "15s"} for port in SCRAPED_PORTS]
    spec = ({"selector": {"matchLabels": selector}, "podMetricsEndpoints": endpoints} if pod_monitor
            else {"selector": {"matchLabels": selector}, "endpoints": endpoints})
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor" if pod_monitor else "ServiceMonitor",
            "metadata": _metadata(name, namespace, labels), "spec": spec}


def _metadata(name: str, namespace: str, labels: Dict[str, str]) -> Dict:
    meta = {"name": name, "labels": dict(labels)}
    if namespace:
        meta["namespace"] = namespace
    return meta


# (title, unit, [(legend, PromQL)]): what the dashboard shows, one panel each.
PANELS = (
    ("Throughput", "reqps", [("{{model}}", "sum by (model) (rate(latte_requests_total[5m]))")]),
    ("Latency P50 / P95 / P99", "µs", [
        (f"{{{{model}}}} P{q}", f"histogram_quantile(0.{q}, sum by (model, le) (rate(latte_request_duration_us_bucket[5m])))")
        for q in (50, 95, 99)]),
    ("Queue", "short", [("{{model}} pending", "sum by (model) (nv_inference_pending_request_count)"),
                        ("{{model}} queue µs per request",
                         "sum by (model) (rate(nv_inference_queue_duration_us[5m])) "
                         "/ clamp_min(sum by (model) (rate(nv_inference_request_success[5m])), 1e-9)")]),
    ("Batch size", "short", [("{{model}}", "sum by (model) (rate(latte_batch_size_sum[5m])) "
                                           "/ clamp_min(sum by (model) (rate(latte_batch_size_count[5m])), 1e-9)")]),
    ("Arena bytes", "bytes", [("{{model}} {{state}}", 'sum by (model, state) (latte_arena_bytes{state=~"capacity|live|allocated"})'),
                              ("{{model}} largest free block",
                               'min by (model) (latte_arena_fit_bytes{figure="largest_free_block"})')]),
    ("Fragmentation alarm", "short", [("{{model}}", "max by (model) (latte_arena_fragmented)")]),
    ("Per-step time (fused models)", "µs", [
        ("{{model}} {{step}}", "sum by (model, step) (rate(latte_step_us_total[5m])) "
                               "/ clamp_min(sum by (model, step) (rate(latte_step_calls_total[5m])), 1e-9)")]),
    ("Resident memory", "bytes", [("{{model}} {{pod}}", "sum by (model, pod) (latte_resident_memory_bytes)")]),
    ("Errors by reason", "reqps", [("{{model}} {{outcome}}",
                                    'sum by (model, outcome) (rate(latte_requests_total{outcome!="success"}[5m]))')]),
    ("Model restarts (10 min) and models down", "short", [
        ("{{model}} {{reason}}", "sum by (model, reason) (increase(latte_model_restarts_total[10m]))"),
        ("models down", "sum(latte_models_down)")]),
)


def dashboard(name: str) -> Dict:
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append({"id": i + 1, "type": "timeseries", "title": title,
                       "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                       "datasource": {"type": "prometheus", "uid": "${datasource}"},
                       "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                       "targets": [{"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend}
                                   for j, (legend, expr) in enumerate(targets)]})
    return {"title": f"Latte: {name}", "uid": f"latte-{name}"[:40], "schemaVersion": 39, "version": 1,
            "editable": True, "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
            "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                     "label": "Prometheus"}]},
            "panels": panels}


def dashboard_configmap(name: str, namespace: str, labels: Dict[str, str], board: Dict) -> Dict:
    key, value = GRAFANA_SIDECAR_LABEL
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _metadata(f"{name}-dashboard", namespace, {**labels, key: value}),
            "data": {f"{name}.json": json.dumps(board, indent=1)}}


def expressions(board: Dict, rules: Dict) -> List[str]:
    """Every PromQL expression the dashboard and the rules hold, for checking them all."""
    found = [t["expr"] for p in board["panels"] for t in p["targets"]]
    found += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    return found


def slo_by_model(models: Sequence, default_ms: float) -> Dict[str, float]:
    """Each latte model's SLO: its own (config parameter slo_ms) or the default."""
    return {m.name: (m.slo_ms or default_ms) for m in models if m.backend == "latte"}
