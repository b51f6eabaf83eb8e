"""The rendered alert rules and dashboard, checked with Prometheus's own promtool: every
expression parses, each alert fires on series that should fire it, and a healthy soak-shaped
run fires nothing. promtool comes from Debian's `prometheus` package (`make test` installs it
where it can); without it these tests skip and say so."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from latte.deploy import monitoring

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not found: install Debian's prometheus package "
                                                         "(apt-get install prometheus), as `make test` does as root")
SETTINGS = monitoring.AlertSettings(slo_ms={"m": 100.0}, forecast_horizon_h=6.0, error_ratio=0.01,
                                    rss_growth_mib_per_h=256.0)
MINUTES = 180
PER_MINUTE = 1000       # requests a minute in every scenario


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def values(per_minute: List[float]) -> str:
    """A counter's values, one a minute, from its increments."""
    total, out = 0.0, []
    for step in per_minute:
        out.append(f"{total:g}")
        total += step
    return " ".join(out)


def latency_series(fast_share_by_minute: List[float], namespace: str = "") -> List[Dict]:
    """latte_request_duration_us of model m: each minute PER_MINUTE requests, the given share of them
    under 50 ms and the rest between 50 and 200 ms, so P95 = 50 + 150 (0.95 - share) / (1 - share) ms."""
    fast = [PER_MINUTE * share for share in fast_share_by_minute]
    every = [PER_MINUTE] * len(fast_share_by_minute)
    where = f'namespace="{namespace}", ' if namespace else ""
    return [{"series": f'latte_request_duration_us_bucket{{{where}model="m", le="{le}"}}', "values": values(counts)}
            for le, counts in (("50000", fast), ("200000", every), ("+Inf", every))] + [
        {"series": f'latte_request_duration_us_count{{{where}model="m"}}', "values": values(every)}]


def healthy_series() -> List[Dict]:
    flat = [0.0] * MINUTES
    return latency_series([0.949] * MINUTES) + [
        {"series": 'latte_requests_total{model="m", outcome="success"}', "values": values([PER_MINUTE] * MINUTES)},
        {"series": 'latte_requests_total{model="m", outcome="overloaded"}', "values": values(flat)},
        {"series": 'latte_arena_fragmented{model="m"}', "values": f"0x{MINUTES}"},
        {"series": 'latte_arena_failures{model="m", kind="fragmentation"}', "values": f"0x{MINUTES}"},
        {"series": 'latte_resident_memory_bytes{model="m", pod="p"}', "values": f"{512 * 2 ** 20}x{MINUTES}"},
        # The supervisor's series (latte serve's health port): every reason from 0, nothing given up.
        *({"series": f'latte_model_restarts_total{{model="m", pod="p", reason="{reason}"}}', "values": values(flat)}
          for reason in ("died", "hung", "rejuvenated", "gave_up")),
        {"series": 'latte_model_given_up{model="m", pod="p"}', "values": f"0x{MINUTES}"},
    ]


# Alerts judged per pod: their series carry the pod they come from.
PER_POD = {"LatteResidentMemoryGrowing", "LatteModelRestarted", "LatteModelGivenUp"}


def expected(alert: str, **more: str) -> Dict:
    rule = next(r for r in monitoring.alert_rules(SETTINGS) if r["alert"] == alert)
    labels = {"severity": rule["labels"]["severity"], "model": "m", **more}
    if alert in PER_POD:
        labels["pod"] = "p"
    annotations = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], v)
                   for k, v in rule["annotations"].items()}
    return {"exp_labels": labels, "exp_annotations": annotations}


def scenario(series: List[Dict], checks: Dict[str, object], at: str = f"{MINUTES - 5}m") -> Dict:
    """One promtool test: `series`, and at `at` each alert named firing (True, or the labels it fires
    with besides model and pod) or quiet (False)."""
    def alerts(alert: str, fires) -> List[Dict]:
        return [] if not fires else [expected(alert, **(fires if isinstance(fires, dict) else {}))]

    return {"interval": "1m", "input_series": series,
            "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": alerts(alert, fires)}
                                for alert, fires in checks.items()]}


def test_the_same_model_in_two_namespaces_is_judged_in_each(rules):
    """One deployment's model over its SLO pages for that namespace only."""
    series = latency_series([0.90] * MINUTES, namespace="slow") + latency_series([0.949] * MINUTES, namespace="fast")
    test = {"interval": "1m", "input_series": series,
            "alert_rule_test": [{"eval_time": f"{MINUTES - 5}m", "alertname": "LatteP95AboveSLO",
                                 "exp_alerts": [expected("LatteP95AboveSLO", namespace="slow")]}]}
    tests = rules.parent / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": [test]},
                                    sort_keys=False, width=100000))
    run = promtool("test", "rules", tests.name, cwd=rules.parent)
    assert run.returncode == 0, run.stdout + run.stderr


def replaced(series: List[Dict], name: str, new_values: str) -> List[Dict]:
    return [{**s, "values": new_values} if s["series"] == name else s for s in series]


ALERTS = [r["alert"] for r in monitoring.alert_rules(SETTINGS)]


def scenarios() -> Dict[str, Dict]:
    healthy = healthy_series()
    # P95 rising by about 5 ms every 20 minutes, from 53 to 88 ms: below the 100 ms SLO throughout.
    degrading = latency_series([share for share in (0.949, 0.947, 0.945, 0.943, 0.941, 0.939, 0.937, 0.935, 0.933)
                                for _ in range(20)]) + healthy[4:]
    errors = [PER_MINUTE * 0.05] * MINUTES
    return {
        "healthy soak: nothing fires": scenario(healthy, {alert: False for alert in ALERTS}),
        "degrading latency: the trend fires before the SLO is crossed": scenario(
            degrading, {"LatteP95TrendCrossesSLO": True, "LatteP95AboveSLO": False}),
        "P95 above the SLO": scenario(latency_series([0.90] * MINUTES) + healthy[4:],
                                      {"LatteP95AboveSLO": True, "LatteP95TrendCrossesSLO": False}),
        "fragmentation alarm": scenario(replaced(healthy, 'latte_arena_fragmented{model="m"}',
                                                 f"0x{MINUTES - 20} 1x20"), {"LatteArenaFragmented": True}),
        "fragmentation failures": scenario(replaced(healthy, 'latte_arena_failures{model="m", kind="fragmentation"}',
                                                    f"0x{MINUTES - 8} 3x8"),
                                           {"LatteArenaFragmentationFailures": True}),
        "queue saturation": scenario(replaced(healthy, 'latte_requests_total{model="m", outcome="overloaded"}',
                                              values([20.0] * MINUTES)), {"LatteQueueSaturated": True}),
        "resident memory growing 1 GiB an hour": scenario(
            replaced(healthy, 'latte_resident_memory_bytes{model="m", pod="p"}',
                     f"{512 * 2 ** 20}+{2 ** 30 // 60}x{MINUTES - 1}"), {"LatteResidentMemoryGrowing": True}),
        "5 % of requests failing": scenario(
            healthy + [{"series": 'latte_requests_total{model="m", outcome="model_error"}', "values": values(errors)}],
            {"LatteRequestsFailing": True, "LatteQueueSaturated": False}),
        # One death 3 minutes before the evaluation: latte restarted the model.
        "a model's process died": scenario(
            replaced(healthy, 'latte_model_restarts_total{model="m", pod="p", reason="died"}',
                     values([0.0] * (MINUTES - 9) + [1.0] + [0.0] * 8)),
            {"LatteModelRestarted": {"reason": "died"}, "LatteModelGivenUp": False}),
        "a model hung": scenario(
            replaced(healthy, 'latte_model_restarts_total{model="m", pod="p", reason="hung"}',
                     values([0.0] * (MINUTES - 9) + [1.0] + [0.0] * 8)),
            {"LatteModelRestarted": {"reason": "hung"}}),
        # A death 15 minutes ago is out of the 10-minute window.
        "a restart long ago": scenario(
            replaced(healthy, 'latte_model_restarts_total{model="m", pod="p", reason="died"}',
                     values([0.0] * (MINUTES - 21) + [1.0] + [0.0] * 20)),
            {"LatteModelRestarted": False}),
        # A reload for health (no failed request) is no restart to warn about.
        "rejuvenations only": scenario(
            replaced(healthy, 'latte_model_restarts_total{model="m", pod="p", reason="rejuvenated"}',
                     values([0.0] * (MINUTES - 9) + [1.0] * 9)),
            {"LatteModelRestarted": False, "LatteModelGivenUp": False}),
        # Given up, then the kubelet restarts the container (liveness): the gauge is seen for one
        # scrape and the series is gone until the new process serves it at 0 again.
        "a model given up": scenario(
            replaced(healthy, 'latte_model_given_up{model="m", pod="p"}', f"0x{MINUTES - 10} 1 _x2 0x6"),
            {"LatteModelGivenUp": True}),
        "a model given up long ago": scenario(
            replaced(healthy, 'latte_model_given_up{model="m", pod="p"}', f"0x{MINUTES - 25} 1 _x2 0x21"),
            {"LatteModelGivenUp": False}),
    }


@pytest.fixture
def rules(tmp_path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(monitoring.rules_file(SETTINGS), sort_keys=False))
    return path


def test_the_rendered_rules_pass_promtool_check(rules):
    checked = promtool("check", "rules", str(rules), cwd=rules.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS) + 2} rules found" in checked.stdout


@pytest.mark.parametrize("name", list(scenarios()))
def test_each_alert_fires_when_it_should_and_only_then(rules, name):
    tests = rules.parent / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m",
                                     "tests": [scenarios()[name]]}, sort_keys=False, width=100000))
    run = promtool("test", "rules", tests.name, cwd=rules.parent)
    assert run.returncode == 0, run.stdout + run.stderr


def test_promtool_notices_an_alert_that_does_not_fire(rules):
    """The scenarios can fail: one that expects the P95 alert on a healthy run is refused."""
    wrong = scenario(healthy_series(), {"LatteP95AboveSLO": True})
    tests = rules.parent / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m", "tests": [wrong]},
                                    sort_keys=False, width=100000))
    run = promtool("test", "rules", tests.name, cwd=rules.parent)
    assert run.returncode != 0 and "LatteP95AboveSLO" in run.stdout + run.stderr


def test_every_dashboard_and_rule_expression_parses(tmp_path):
    board = monitoring.dashboard("latte")
    exprs = monitoring.expressions(board, monitoring.rules_file(SETTINGS))
    assert len(exprs) >= len(monitoring.PANELS) + len(ALERTS)
    # promtool parses PromQL where it checks rules: each expression as a recording rule.
    path = tmp_path / "exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "parse", "rules": [
        {"record": f"latte:parse_{i}", "expr": e} for i, e in enumerate(exprs)]}]}))
    checked = promtool("check", "rules", str(path), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for panel in board["panels"]:
        assert panel["targets"] and panel["gridPos"]["w"] > 0 and panel["datasource"]["type"] == "prometheus"
