"""The serving-cost line through calibration's two points, and how a profile keeps it."""

import pytest

from latte.generator.calibrate import ServingCost, fit, write_calibration_repository
from latte.generator.profile_data import Point, Profile
from latte.generator.validate import validate_repository


def test_two_points_give_per_batch_and_per_request_cost():
    # 1 request: 0.6 ms of compute; a batch of 16: 1.35 ms -> 0.05 ms per request, 0.55 ms per batch.
    cost = fit(single_compute_ms=0.6, batched_compute_ms=1.35, batch_size=16, round_trip_ms=0.9)
    assert cost.request_ms == pytest.approx(0.05)
    assert cost.batch_ms == pytest.approx(0.55)
    assert cost.batch_overhead_ms(8) == pytest.approx(0.95)
    assert cost.round_trip_ms == pytest.approx(0.9) and cost.source == "calibrated"


def test_no_batches_formed_puts_the_whole_cost_on_the_batch():
    cost = fit(single_compute_ms=0.6, batched_compute_ms=0.9, batch_size=1.0, round_trip_ms=0.5)
    assert (cost.batch_ms, cost.request_ms) == (pytest.approx(0.6), 0.0)


def test_noise_never_yields_negative_costs():
    # A batched point faster than the single one (a busy moment during the single run).
    cost = fit(single_compute_ms=0.8, batched_compute_ms=0.5, batch_size=16, round_trip_ms=-0.2)
    assert cost.request_ms == 0.0 and cost.batch_ms == pytest.approx(0.8) and cost.round_trip_ms == 0.0


def test_profile_json_keeps_the_calibration(tmp_path):
    profile = Profile("m.onnx", "onnx", "cpu", 1, [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
                      [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}], [Point(1, None, 1.0, 1.0, 1.2, 10)])
    profile.serving = ServingCost(batch_ms=0.4, request_ms=0.02, round_trip_ms=0.7, max_rate=5000.0, source="calibrated")
    loaded = Profile.load(profile.save(tmp_path / "profile.json"))
    assert loaded.serving == profile.serving
    profile.serving = None
    assert Profile.load(profile.save(tmp_path / "plain.json")).serving is None


def test_calibration_repository_is_valid(tmp_path):
    configs = validate_repository(write_calibration_repository(tmp_path / "repo"))
    assert sorted(configs) == ["identity_batched", "identity_single"]
    assert list(configs["identity_batched"].dynamic_batching.preferred_batch_size) == [16]
    assert not configs["identity_single"].HasField("dynamic_batching")


def test_larger_requests_lower_the_hosts_request_ceiling():
    # 3000 requests/s of 256 B and 2000 of 16 KiB: 1/2000 - 1/3000 = 0.1667 ms over 15.75 KiB.
    cost = fit(0.6, 1.35, 16, 0.5, max_rate=3000.0, large_rate=2000.0)
    assert cost.kib_ms == pytest.approx(0.1667 / 15.75, rel=1e-3)
    assert cost.request_ceiling(256) == pytest.approx(3000.0)
    assert cost.request_ceiling(256 + 15.75 * 1024) == pytest.approx(2000.0)
    assert ServingCost().request_ceiling(1 << 20) == 0.0      # not measured: no ceiling
