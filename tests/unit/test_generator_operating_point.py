"""The planned loads `latte generate` leaves in REPO/latte_plan.json for verify and tune."""

import pytest

from latte.generator.calibrate import ServingCost
from latte.generator.generate import generate
from latte.generator.operating_point import read_operating_points
from latte.generator.profile_data import Profile


def test_uncalibrated_profile_plans_the_latte_model_but_not_the_ensemble(sequence_pipeline, tmp_path):
    plans = {p.name: p for p in generate(sequence_pipeline / "pipeline.yaml", tmp_path / "repo", fuse=False)}
    points = read_operating_points(tmp_path / "repo")
    assert sorted(points) == ["encoder"]        # python steps' cost is unknown without a calibration
    encoder = points["encoder"]
    assert encoder.slo_ms == 20 and encoder.rate_source == "derived"
    assert encoder.rate == pytest.approx(0.8 * plans["encoder"].derivation.throughput)
    assert encoder.profile == str(sequence_pipeline / "encoder.json")


def test_ensemble_sustains_the_shared_host_rate_of_its_steps(sequence_pipeline, tmp_path):
    profile = Profile.load(sequence_pipeline / "encoder.json")
    profile.serving = ServingCost(batch_ms=0.1, request_ms=0.01, round_trip_ms=0.2, max_rate=3000.0,
                                  source="calibrated")
    profile.save(tmp_path / "calibrated.json")
    spec = tmp_path / "pipeline.yaml"
    spec.write_text((sequence_pipeline / "pipeline.yaml").read_text().replace(
        str(sequence_pipeline / "encoder.json"), str(tmp_path / "calibrated.json")))
    for name in ("tokenize.py", "normalize.py", "sequence", "samples.json"):
        (tmp_path / name).symlink_to(sequence_pipeline / name)
    plans = {p.name: p for p in generate(spec, tmp_path / "repo", fuse=False)}
    points = read_operating_points(tmp_path / "repo")
    encoder = plans["encoder"].derivation.throughput
    # tokenize and normalize each cost a served request that computes nothing (1/3000 s) plus a
    # batch of one (0.11 ms); the encoder its own.
    python_step = 1 / (1 / 3000.0 + 0.11 / 1000)
    assert points["embed_text"].rate == pytest.approx(0.8 / (1 / encoder + 2 / python_step))
    assert points["embed_text"].rate < points["encoder"].rate
    assert points["embed_text"].slo_ms == 20


def test_a_fused_ensemble_is_planned_by_its_own_derivation_against_the_ensembles_slo(sequence_pipeline, tmp_path):
    from latte.generator.derive import DEFAULT_BACKEND_OVERHEAD_MS, derive

    generate(sequence_pipeline / "pipeline.yaml", tmp_path / "repo")
    point = read_operating_points(tmp_path / "repo")["embed_text"]
    assert point.profile == str(sequence_pipeline / "embed_text.json") and point.slo_ms == 20
    fused = derive(Profile.load(sequence_pipeline / "embed_text.json"), 20, cores=2,
                   serving=ServingCost.flat(DEFAULT_BACKEND_OVERHEAD_MS, "assumed"))
    assert point.rate == pytest.approx(fused.planned_rate) and point.rate_source == "derived"
