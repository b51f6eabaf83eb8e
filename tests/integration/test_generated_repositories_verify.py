"""Every example `latte generate` renders keeps up with the load it was planned for under `latte verify`.

One spec holds the example pipeline (tokenize -> encoder -> normalize, ensemble embed_text,
fused) and the mlp and cnn examples as single models; generate profiles and calibrates them,
one tritonserver serves the result, and each model is verified with Poisson arrivals at
its planned rate: the server answers as fast as requests arrive, and the median and the tail
stay within margins of the SLO (see KEPT_UP).
"""

from pathlib import Path

import pytest

from conftest import assert_stopped_promptly

pytestmark = pytest.mark.integration

SINGLE_MODELS = """\
  - name: mlp
    file: mlp/model.onnx
    slo_ms: 50
  - name: cnn
    file: cnn/model.onnx
    slo_ms: 100
"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from latte.examples import EXAMPLES, export
    from latte.examples.pipeline import write_pipeline
    from latte.generator.generate import generate

    work = tmp_path_factory.mktemp("generated")
    spec = write_pipeline(work, slo_ms=100, cores=2)
    for name in ("mlp", "cnn"):
        export(EXAMPLES[name], work / name)
    spec.write_text(spec.read_text().replace("models:\n", "models:\n" + SINGLE_MODELS, 1))
    repo = work / "repo"
    # Measured afresh, not taken from the run's kept calibration: the verification below runs
    # right after on the same shared box, while one kept from earlier in the test run can
    # describe another load (in one full run, mlp's planned rate then gave P99 63 ms against 50).
    plans = generate(spec, repo, log=print, recalibrate=True)
    return repo, {p.name: p for p in plans}


def test_generate_calibrates_once_and_plans_a_load_per_latte_model_and_ensemble(generated):
    from latte.generator.operating_point import read_operating_points

    repo, plans = generated
    points = read_operating_points(repo)
    assert sorted(points) == ["cnn", "embed_text", "encoder", "mlp"]
    # The ensemble is fused: planned by its own profile, taken on the pipeline's sample texts.
    fused = points["embed_text"]
    assert fused.rate_source == "derived" and fused.profile.endswith("profiles/embed_text.json")
    assert Path(fused.profile).is_file() and fused.slo_ms == points["encoder"].slo_ms
    for name in ("cnn", "encoder", "mlp"):
        point = points[name]
        derivation = plans[name].derivation
        assert point.rate == pytest.approx(0.8 * derivation.throughput) and point.rate_source == "derived"
        assert plans[name].profile.serving.source == "calibrated"
        assert "calibrated serving cost" in derivation.explain()
    assert len({plans[n].profile.serving for n in ("cnn", "encoder", "mlp")}) == 1   # one calibration for the spec


# The plan's arithmetic is unit-tested (test_generator_derive, test_generator_operating_point);
# here it meets a server on a shared box, whose neighbours move the latencies as much as a
# plan some way off would: with one of the 2 cores kept busy, the right rate gave P99 up to
# 4.2x the SLO and P50 up to 1.3x (mlp: 208 and 66 ms against 50), where the quiet box gives
# 0.3x and 0.05x; on the quiet box, 1.6x the planned rate gave P99 1.3-6.6x. So a count leads:
# the server answers as many requests a second as arrive (perf_analyzer's throughput falls to
# what the model sustains when the rate exceeds it, and a rejected request fails the run). The
# planned rates are thousands a second (quiet box: the throughput 1.00-1.01x the rate), so the
# Poisson draw moves the count by about 1 %; a neighbour that takes a core for a measurement can
# take a fifth of it, and a measurement that falls short is taken once more: a plan a quarter or
# more above what the model serves falls short in both. The latencies are held only to margins
# that a plan far off, whose queue grows through the measurement, breaks.
KEPT_UP = 0.8
MEASUREMENTS = 2
MEDIAN_MARGIN = 3.0
TAIL_MARGIN = 10.0


@pytest.mark.parametrize("model", ["mlp", "cnn", "encoder", "embed_text"])
def test_generated_model_keeps_up_with_the_planned_rate_within_its_slo(generated, verify_server, model):
    from latte.generator.verify import verify

    repo, _ = generated
    for _ in range(MEASUREMENTS):
        report = verify(repo, model, url=verify_server.grpc_url, measurement_ms=2000)
        print(report.text())
        if report.throughput >= KEPT_UP * report.rate:
            break
    assert report.rate is not None and "planned load" in report.load_source
    assert report.throughput >= KEPT_UP * report.rate, report.text()      # no queue left to grow (nor rejections)
    assert report.p50_ms <= MEDIAN_MARGIN * report.slo_ms, report.text()
    assert report.p99_ms <= TAIL_MARGIN * report.slo_ms, report.text()
    # The verdict is the P99 against the SLO, and a missed SLO, only that, comes with the one
    # setting of this model's config to change.
    verdict = "the SLO holds" if report.p99_ms <= report.slo_ms else "the SLO does NOT hold"
    assert verdict in report.text(), report.text()
    if report.slo_met:
        assert report.suggestion is None, report.text()
    else:
        assert report.suggestion.startswith(f"{model}: "), report.text()
        assert f"suggestion: {report.suggestion}" in report.text()


@pytest.fixture(scope="module")
def verify_server(generated):
    from latte.triton import TritonServer

    repo, _ = generated
    with TritonServer(repo) as server:
        yield server
    assert_stopped_promptly(server)


def test_tune_measures_the_derived_config_and_keeps_the_measurements_next_to_the_profile(generated):
    import json
    from pathlib import Path

    from latte.generator.operating_point import read_operating_points
    from latte.generator.tune import tune

    repo, _ = generated
    before = (repo / "mlp" / "config.pbtxt").read_text()
    # No moves: the derived config alone, in closed loop and at the planned Poisson rate.
    result = tune(repo, "mlp", max_steps=0, measurement_ms=500)
    assert result.best is result.start and len(result.measurements) == 1
    start = result.start
    assert start.error is None and start.score > 0 and start.poisson_p99_ms is not None
    assert start.rows[0]["concurrency"] == start.candidate.instances
    record = Path(read_operating_points(repo)["mlp"].profile).with_suffix(".tune.json")
    kept = json.loads(record.read_text())
    assert kept["winner"] == start.candidate.label and kept["measurements"][0]["score"] == start.score
    assert (repo / "mlp" / "config.pbtxt").read_text() == before     # nothing better: config untouched
    assert "winner" in result.table()
