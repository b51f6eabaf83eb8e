"""A soak read against a control served beside the model: the host's swing, which moves both,
is taken out of the drift the targets judge."""

import pytest

from latte.bench.soak import LONG_TARGETS, SoakSettings, check_ratios, format_ratios


def ratios(p99_drift, control_p99_drift):
    found = {"server_rss_growth": 0.001, "stubs_rss_growth": 0.0, "p99_drift": p99_drift, "p50_drift": 0.01,
             "p99_drift_thirds": p99_drift / 2, "throughput_change": 0.0, "fragmentation_first": None,
             "fragmentation_last": None, "fragmented_windows": 0, "fragmentation_failures": 0,
             "largest_free_last": None, "p99_request_last": None, "arena_reserved_growth": 0.0}
    if control_p99_drift is not None:
        found.update(control_p99_drift=control_p99_drift,
                     p99_drift_vs_control=(1 + p99_drift) / (1 + control_p99_drift) - 1,
                     p99_drift_thirds_vs_control=0.0, p50_drift_vs_control=0.0)
    return found


def test_a_drift_the_control_shares_is_the_hosts_and_passes():
    assert check_ratios(ratios(0.40, 0.38), LONG_TARGETS) == []


def test_without_a_control_the_same_drift_fails():
    assert check_ratios(ratios(0.40, None), LONG_TARGETS) == ["p99_drift = +40.0% exceeds the bound 5%"]


def test_a_drift_of_the_model_alone_fails_against_the_control():
    assert check_ratios(ratios(0.20, 0.0), LONG_TARGETS) == ["p99_drift_vs_control = +20.0% exceeds the bound 5%"]


def test_the_report_names_the_controls_drift_and_the_relative_one():
    lines = format_ratios(ratios(0.10, 0.05))
    assert any(line.startswith("P99 drift against the control's:") and line.endswith("+4.8%") for line in lines)


def test_the_control_is_another_model():
    with pytest.raises(ValueError, match="the control must be another model than the one soaked"):
        SoakSettings("m", requests=100, windows=2, control="m").validate()
