"""Length distributions, generated inputs and the soak's amount syntax."""

import json

import numpy as np
import pytest

from latte.bench.inputs import ModelInputError, parse_model_inputs, write_perf_input_data
from latte.bench.lengths import LengthDistribution, LengthSpecError
from latte.bench.soak import check_ratios, parse_soak_amount

SEQUENCE_CONFIG = {"name": "sequence_onnx", "max_batch_size": 32,
                   "input": [{"name": "tokens", "data_type": "TYPE_INT64", "dims": ["-1"]}],
                   "parameters": {"max_sequence_length": {"string_value": "128"}}}


@pytest.mark.parametrize("text", ["fixed:length=32", "uniform:low=1,high=128", "lognormal:median=24,sigma=0.8",
                                  "zipf:buckets=8-16-32-64-128,s=1.2"])
def test_every_distribution_stays_within_one_to_the_maximum(text):
    lengths = LengthDistribution.parse(text).sample(np.random.default_rng(0), 5000, 100)
    assert lengths.min() >= 1 and lengths.max() <= 100


def test_distributions_have_their_shape():
    rng = np.random.default_rng(0)
    assert set(LengthDistribution.parse("fixed:length=7").sample(rng, 100, 128)) == {7}
    logn = LengthDistribution.parse("lognormal:median=24,sigma=0.5").sample(rng, 20000, 1000)
    assert 22 <= np.median(logn) <= 26
    zipf = LengthDistribution.parse("zipf:buckets=8-16-32,s=1.5").sample(rng, 20000, 128)
    counts = {b: int((zipf == b).sum()) for b in (8, 16, 32)}
    assert set(np.unique(zipf)) == {8, 16, 32}
    assert counts[8] > counts[16] > counts[32]  # the shortest bucket is the most frequent


@pytest.mark.parametrize("text, message", [
    ("gamma", "unknown length distribution 'gamma'"),
    ("uniform:low=5,high=2", "low <= high"),
    ("lognormal:mu=3", "lognormal takes median=..., sigma=..."),
    ("zipf:buckets=8-x", "buckets must be lengths joined by '-'"),
    ("fixed:length=abc", "length must be a number"),
])
def test_bad_distributions_say_what_was_expected(text, message):
    with pytest.raises(LengthSpecError, match=message):
        LengthDistribution.parse(text)


def test_generated_requests_follow_the_model_config_and_feed_perf_analyzer(tmp_path):
    inputs = parse_model_inputs(SEQUENCE_CONFIG)
    assert inputs.variable and inputs.max_length == 128
    path, drawn = write_perf_input_data(tmp_path / "data.json", inputs, LengthDistribution.parse("uniform:low=3,high=9"),
                                        20)
    data = json.loads(path.read_text())["data"]
    assert len(data) == 20
    assert [d["tokens"]["shape"] for d in data] == [[n] for n in drawn]
    assert all(3 <= n <= 9 for n in drawn) and len(set(drawn)) > 1
    assert all(1 <= v < 100 for d in data for v in d["tokens"]["content"])


def test_an_unsupported_input_type_is_named():
    config = {"name": "m", "max_batch_size": 0, "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}]}
    with pytest.raises(ModelInputError, match="input 'text' has type 'TYPE_STRING'"):
        parse_model_inputs(config)


@pytest.mark.parametrize("text, expected", [("20000", {"requests": 20000}), ("20k", {"requests": 20000}),
                                            ("1M", {"requests": 1_000_000}), ("90s", {"duration_s": 90.0}),
                                            ("10min", {"duration_s": 600.0}), ("10m", {"duration_s": 600.0}),
                                            ("2h", {"duration_s": 7200.0})])
def test_soak_amounts(text, expected):
    assert parse_soak_amount(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-5", "0s"])
def test_bad_soak_amounts_are_refused(text):
    with pytest.raises(ValueError, match="request count .* or a duration"):
        parse_soak_amount(text)


def test_ratio_checks_report_what_is_over_its_bound():
    ratios = {"server_rss_growth": 0.01, "stubs_rss_growth": 0.05, "p99_drift": -0.2, "fragmentation_last": None}
    assert check_ratios(ratios, {"rss_growth": 0.02, "p99_drift": 0.05}) == [
        "stubs_rss_growth = +5.0% exceeds the bound 2%"]
