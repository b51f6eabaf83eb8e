"""The parts of `latte verify` that decide the load and the correction, on rendered configs."""

import pytest

from latte.generator.operating_point import OperatingPoint, write_operating_points
from latte.generator.validate import parse_config
from latte.generator.verify import (VerifyError, VerifyReport, batching_config, input_samples, intended_load,
                                    operating_concurrency, suggest)

CONFIG = """
name: "enc" backend: "latte" max_batch_size: 16
input { name: "tokens" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true }
output { name: "embedding" data_type: TYPE_FP32 dims: [ 32 ] }
dynamic_batching { max_queue_delay_microseconds: 3000
                   default_queue_policy { max_queue_size: 24 default_timeout_microseconds: 9000 } }
instance_group { count: 2 kind: KIND_CPU }
"""
ENSEMBLE = """
name: "ens" platform: "ensemble" max_batch_size: 8
input { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }
output { name: "E" data_type: TYPE_FP32 dims: [ 32 ] }
ensemble_scheduling { step { model_name: "enc" model_version: -1 input_map { key: "tokens" value: "TEXT" }
                             output_map { key: "embedding" value: "E" } } }
"""


def report(p99, queue_us, compute_us, slo=20.0, p50=None):
    return VerifyReport("enc", slo, None, p99, p99 / 2 if p50 is None else p50, 100.0, queue_us, compute_us, None,
                        rate=300.0)


def test_operating_point_fills_every_instance_within_the_queue_limit():
    config = parse_config(CONFIG)
    assert operating_concurrency(config) == 24          # 2 x 16 = 32, capped by max_queue_size 24
    configs = {"enc": config, "ens": parse_config(ENSEMBLE)}
    assert batching_config(configs, "ens").name == "enc"


def test_no_suggestion_when_the_slo_holds():
    assert suggest(parse_config(CONFIG), report(15.0, 5000, 1000)) is None


def test_queue_bound_miss_lowers_the_delay_by_the_overshoot():
    text = suggest(parse_config(CONFIG), report(22.0, 5000, 1000))
    assert "max_queue_delay_microseconds from 3000 to 1000" in text


def test_compute_bound_miss_halves_the_batch():
    text = suggest(parse_config(CONFIG), report(30.0, 500, 12000))
    assert "lower max_batch_size from 16 to 8" in text


def test_samples_fill_variable_dims_and_strings():
    samples = input_samples(parse_config(ENSEMBLE), length=16, count=2)
    assert samples[0]["TEXT"].shape == (1,) and isinstance(samples[0]["TEXT"][0], str)
    tokens = input_samples(parse_config(CONFIG), length=16)[0]["tokens"]
    assert tokens.shape == (16,) and tokens.dtype.name == "int64" and tokens.min() >= 1


def test_generated_repository_is_verified_at_its_planned_rate(tmp_path):
    write_operating_points(tmp_path, {"enc": OperatingPoint(slo_ms=25.0, rate=480.0, rate_source="derived")})
    load, slo = intended_load(tmp_path, parse_config(CONFIG), slo_ms=None)
    assert (load.rate, load.concurrency, slo) == (480.0, None, 25.0)
    assert load.perf_args() == {"request_rate": [480.0], "extra_args": ["--request-distribution", "poisson", "--async"]}
    assert "80% of the throughput the derivation promised" in load.source
    # Flags win over the plan.
    assert intended_load(tmp_path, parse_config(CONFIG), 10.0, rate=50.0)[0].rate == 50.0
    assert intended_load(tmp_path, parse_config(CONFIG), 10.0, concurrency=3)[0].perf_args() == {"concurrency": [3]}


def test_repository_without_a_plan_is_driven_in_closed_loop_and_needs_an_slo(tmp_path):
    load, slo = intended_load(tmp_path, parse_config(CONFIG), slo_ms=20.0)
    assert (load.rate, load.concurrency, slo) == (None, 24, 20.0)
    with pytest.raises(VerifyError, match="give --slo-ms"):
        intended_load(tmp_path, parse_config(CONFIG), slo_ms=None)
    with pytest.raises(VerifyError, match="--rate must be positive"):
        intended_load(tmp_path, parse_config(CONFIG), slo_ms=20.0, rate=0)


def test_time_spent_outside_the_model_is_not_blamed_on_its_batch_size():
    # The case: P99 107 ms, queue 1 us, compute 2.3 ms.
    text = suggest(parse_config(CONFIG), report(107.0, 1, 2300, p50=60.0))
    assert "only 2.30 ms of the P50 60.00 ms is spent in this model's queue and compute" in text
    assert "max_batch_size" not in text


def test_queueing_without_a_delay_asks_for_another_instance_within_the_cores():
    config = parse_config(CONFIG.replace("max_queue_delay_microseconds: 3000", "max_queue_delay_microseconds: 0"))
    assert "raise instance_group count to 3" in suggest(config, report(30.0, 9000, 4000), cores=4)
    assert "the load exceeds this host" in suggest(config, report(30.0, 9000, 4000), cores=2)


def test_report_names_the_load_and_why():
    text = VerifyReport("enc", 20.0, None, 12.0, 6.0, 450.0, 300, 4000, None, rate=480.0,
                        load_source="enc's planned load").text()
    assert "load: 480 req/s Poisson (enc's planned load)" in text
    assert "the SLO holds" in text


def test_a_full_queue_fails_the_slo_with_its_cause():
    from latte.generator.verify import Load, rejected_report

    verdict = rejected_report("enc", parse_config(CONFIG), 20.0, Load(900.0, None, "--rate"))
    assert not verdict.slo_met
    assert "the server rejected requests (exceeds maximum queue size 24)" in verdict.suggestion
    assert "load: 900 req/s Poisson (--rate)" in verdict.text()


def test_requests_drawn_from_a_length_distribution_each_have_their_own_length():
    from latte.bench.lengths import LengthDistribution
    from latte.generator.verify import DRAWN_REQUESTS, request_samples

    config = parse_config(CONFIG)
    lognormal = LengthDistribution.parse("lognormal:median=16,sigma=0.8")
    drawn = [s["tokens"].shape[0] for s in request_samples(config, lengths=lognormal)]
    assert len(drawn) == DRAWN_REQUESTS
    assert len(set(drawn)) > 10 and min(drawn) >= 1
    assert drawn == [s["tokens"].shape[0] for s in request_samples(config, lengths=lognormal)]  # seeded
    assert {s["tokens"].shape[0] for s in request_samples(config, length=24)} == {24}


def test_drawn_lengths_stop_at_the_configs_max_sequence_length():
    from latte.bench.lengths import LengthDistribution
    from latte.generator.verify import request_samples

    config = parse_config(CONFIG)
    config.parameters["max_sequence_length"].string_value = "20"
    uniform = LengthDistribution.parse("uniform:low=1,high=500")
    assert max(s["tokens"].shape[0] for s in request_samples(config, lengths=uniform)) <= 20
