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


class _Install:
    def __init__(self, server):
        self.server = server


def test_a_machine_calibrates_once_and_reuses_it_until_asked_or_changed(tmp_path, monkeypatch):
    import latte.generator.calibrate as calibrate_module

    measured = []

    def fake_calibrate(install, log):
        measured.append(install.server)
        return ServingCost(batch_ms=0.4 + len(measured), request_ms=0.02, round_trip_ms=0.8, source="calibrated")

    monkeypatch.setattr(calibrate_module, "calibrate", fake_calibrate)
    server = tmp_path / "tritonserver"
    server.write_bytes(b"binary")
    install, cache = _Install(server), tmp_path / "cache"
    lines = []

    first = calibrate_module.machine_serving_cost(install, cache_dir=cache)
    again = calibrate_module.machine_serving_cost(install, log=lines.append, cache_dir=cache)
    assert again == first and len(measured) == 1
    assert "kept from" in lines[0] and "--recalibrate" in lines[0]

    fresh = calibrate_module.machine_serving_cost(install, cache_dir=cache, refresh=True)
    assert len(measured) == 2 and fresh.batch_ms == pytest.approx(2.4)

    server.write_bytes(b"another tritonserver build")  # the serving stack changed: measure again
    calibrate_module.machine_serving_cost(install, cache_dir=cache)
    assert len(measured) == 3


def test_an_old_or_unreadable_calibration_is_measured_again(tmp_path, monkeypatch):
    import json
    import latte.generator.calibrate as calibrate_module

    calls = []
    monkeypatch.setattr(calibrate_module, "calibrate",
                        lambda install, log: calls.append(1) or ServingCost(batch_ms=0.5, source="calibrated"))
    server = tmp_path / "tritonserver"
    server.write_bytes(b"binary")
    install, cache = _Install(server), tmp_path / "cache"
    calibrate_module.machine_serving_cost(install, cache_dir=cache)
    kept = cache / "serving-cost.json"
    data = json.loads(kept.read_text())
    data["measured_at"] -= calibrate_module.CACHE_MAX_AGE_S + 1
    kept.write_text(json.dumps(data))
    calibrate_module.machine_serving_cost(install, cache_dir=cache)
    kept.write_text("{not json")
    calibrate_module.machine_serving_cost(install, cache_dir=cache)
    assert len(calls) == 3
