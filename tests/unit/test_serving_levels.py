"""How the serving and pipelines benchmarks (benchmarks/serving.py) read their levels: the best
level within the SLO, and the per-level figures the results keep."""

from types import SimpleNamespace

import pytest

import bench_scripts


@pytest.fixture(scope="module")
def serving():
    return bench_scripts.load("serving")


def test_the_best_level_is_the_fastest_whose_p99_is_within_the_slo(serving):
    p99 = {1: 5.0, 4: 9.0, 16: 30.0, 64: None}
    throughput = {1: 100.0, 4: 300.0, 16: 900.0, 64: 1000.0}
    assert serving.best_level([1, 4, 16, 64], 10.0, p99.get, throughput.get) == 4
    assert serving.best_level([1, 4, 16, 64], 40.0, p99.get, throughput.get) == 16
    assert serving.best_level([1, 4, 16, 64], 1.0, p99.get, throughput.get) is None


def test_level_figures_keep_each_round_by_level_as_text(serving):
    point = SimpleNamespace(as_dict=lambda: {"throughput": 1.0})
    figures = serving.level_figures({"latte": {1: [point, point]}}, {"latte": {1: [{"total": 7.0}]}})
    assert figures == {"points": {"latte": {"1": [{"throughput": 1.0}, {"throughput": 1.0}]}},
                       "cpu_us_per_request": {"latte": {"1": [{"total": 7.0}]}}}
