"""Prometheus text parsing and the statistics API's batch-size deltas."""

import pytest

from latte.bench.arena import arena_figures
from latte.bench.prometheus_scrape import MetricsFormatError, parse_prometheus, series_key, split_key, total
from latte.bench.triton_stats import StatsError, parse_stats

TRITON_TEXT = """\
# HELP nv_inference_count Number of inferences performed
# TYPE nv_inference_count counter
nv_inference_count{model="mlp_onnx",version="1"} 120
nv_inference_count{model="cnn_onnx",version="1"} 30
nv_inference_exec_count{model="mlp_onnx",version="1"} 40
nv_pinned_memory_pool_total_bytes 268435456
process_cpu_seconds_total 3.5
latte_arena_bytes{model="mlp_onnx",state="reserved"} 1048576
latte_arena_bytes{model="mlp_onnx",state="live"} 917504
latte_arena_bytes{model="cnn_onnx",state="reserved"} 2097152
latte_arena_fragmentation{kind="external",model="cnn_onnx"} 0.25
latte_sessions{model="mlp_onnx",state="live"} 3
latte_sessions{model="mlp_onnx",state="started"} 9
"""


def test_triton_and_latte_series_are_kept_and_others_dropped():
    values = parse_prometheus(TRITON_TEXT)
    assert values['nv_inference_count{model="mlp_onnx",version="1"}'] == 120
    assert values["nv_pinned_memory_pool_total_bytes"] == 268435456
    assert values['latte_sessions{model="mlp_onnx",state="live"}'] == 3
    assert not any(k.startswith("process_") for k in values)


def test_totals_sum_series_by_label():
    values = parse_prometheus(TRITON_TEXT)
    assert total(values, "nv_inference_count") == 150
    assert total(values, "nv_inference_count", model="cnn_onnx") == 30
    assert total(values, "nv_no_such_series") is None


def test_labels_with_escapes_and_timestamps_parse_and_the_key_gives_the_labels_back():
    values = parse_prometheus('latte_x{path="a\\"b\\\\c\\nd",z="1"} 2.5 1700000000000\n')
    labels = {"path": 'a"b\\c\nd', "z": "1"}
    assert values == {series_key("latte_x", labels): 2.5}
    assert split_key(next(iter(values))) == ("latte_x", labels)
    assert total(values, "latte_x", path='a"b\\c\nd') == 2.5


def test_a_malformed_line_names_its_line_number():
    with pytest.raises(MetricsFormatError, match="line 2"):
        parse_prometheus("nv_ok 1\nthis is not a metric line at all\n")
    with pytest.raises(MetricsFormatError, match="line 3 .*many"):
        parse_prometheus("# TYPE nv_ok counter\nnv_ok 1\nnv_bad{a=\"b\"} many\n")


def test_arena_figures_are_read_per_model_from_the_backends_labelled_series():
    values = parse_prometheus(TRITON_TEXT)
    mlp = arena_figures(values, "mlp_onnx")
    assert mlp["arena_reserved_bytes"] == 1048576 and mlp["arena_live_bytes"] == 917504
    # No fragmentation series for this model: derived from reserved and live bytes.
    assert mlp["fragmentation"] == pytest.approx(1 - 917504 / 1048576)
    assert mlp["live_sessions"] == 3
    assert arena_figures(values, "cnn_onnx")["fragmentation"] == 0.25
    assert arena_figures(values)["arena_reserved_bytes"] == 1048576 + 2097152
    assert arena_figures(parse_prometheus("nv_inference_count 1\n"))["fragmentation"] is None


def _stats(inference, execution, batches):
    return {"model_stats": [{
        "name": "m", "version": "1", "inference_count": inference, "execution_count": execution,
        "inference_stats": {"success": {"count": inference, "ns": 9}, "fail": {"count": 1, "ns": 0},
                            "queue": {"count": inference, "ns": 1000 * inference},
                            "compute_infer": {"count": execution, "ns": 5000 * execution}},
        "batch_stats": [{"batch_size": size, "compute_infer": {"count": count, "ns": 1}} for size, count in batches],
    }]}


def test_batch_sizes_come_from_statistics_deltas():
    before = parse_stats(_stats(10, 10, [(1, 10)]), "m")
    after = parse_stats(_stats(10 + 4 + 16, 10 + 1 + 2, [(1, 10), (4, 1), (8, 2)]), "m")
    delta = after.minus(before)
    assert delta.batches == {4: 1, 8: 2}
    assert delta.inference_count == 20 and delta.execution_count == 3
    assert delta.mean_batch_size == pytest.approx(20 / 3)
    assert delta.as_dict()["batch_size_counts"] == {"4": 1, "8": 2}


def test_statistics_of_another_model_are_an_error():
    with pytest.raises(StatsError, match="'other'"):
        parse_stats(_stats(1, 1, []), "other")
