"""The parts of `latte verify` that decide the load and the correction, on rendered configs."""

from latte.generator.validate import parse_config
from latte.generator.verify import VerifyReport, batching_config, input_samples, operating_concurrency, suggest

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


def report(p99, queue_us, compute_us, slo=20.0):
    return VerifyReport("enc", slo, 24, p99, p99 / 2, 100.0, queue_us, compute_us, None)


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
