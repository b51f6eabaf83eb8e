"""Pipeline spec errors name the spec file, the line and the offending key."""

import textwrap

import pytest

from latte.generator.spec import SpecError, load_spec


@pytest.fixture
def write(tmp_path):
    (tmp_path / "pre.py").write_text("class TritonPythonModel:\n    pass\n")
    (tmp_path / "model.onnx").write_bytes(b"onnx")

    def _write(text):
        path = tmp_path / "spec.yaml"
        path.write_text(textwrap.dedent(text))
        return path
    return _write


GOOD = """\
    resources: {cores: 2}
    models:
      - name: pre
        file: pre.py
        inputs: [{name: X, data_type: FP32, dims: [4]}]
        outputs: [{name: Y, data_type: TYPE_FP32, dims: [4]}]
      - name: net
        file: model.onnx
        slo_ms: 25
        arrival_rate: 100
"""


def test_a_good_spec_loads_with_defaults_filled_in(write):
    spec = load_spec(write(GOOD))
    pre, net = spec.models
    assert (pre.backend, pre.max_batch_size, pre.inputs[0].data_type) == ("python", 16, "TYPE_FP32")
    assert (net.backend, net.runtime, net.slo_ms, net.arrival_rate) == ("latte", "onnx", 25.0, 100.0)
    assert spec.cores == 2 and spec.gpus == 0


@pytest.mark.parametrize("edit, expected", [
    (lambda s: s.replace("        slo_ms: 25\n", ""), r"spec.yaml:7: models\[1\].slo_ms: missing; a latte model needs"),
    (lambda s: s.replace("slo_ms: 25", "slo_ms: fast"), r"spec.yaml:9: models\[1\].slo_ms: expected a number"),
    (lambda s: s.replace("file: model.onnx", "file: other.onnx"), r"spec.yaml:8: models\[1\].file: file .*other.onnx does not exist"),
    (lambda s: s.replace("data_type: FP32", "data_type: FLOAT"), r"spec.yaml:5: models\[0\].inputs\[0\].data_type: unknown data type 'FLOAT'"),
    (lambda s: s.replace("dims: [4]}]\n      - name: net", "dims: [0]}]\n      - name: net"), r"spec.yaml:6: models\[0\].outputs\[0\].dims: dims must be"),
    (lambda s: s.replace("arrival_rate: 100", "arrival_rte: 100"), r"spec.yaml:10: models\[1\].arrival_rte: unknown key"),
    (lambda s: s.replace("name: net", "name: pre"), r"spec.yaml:7: models\[1\].name: model 'pre' is defined twice"),
    (lambda s: s.replace("        inputs: [{name: X, data_type: FP32, dims: [4]}]\n", ""), r"spec.yaml:3: models\[0\].inputs: missing; a python model declares"),
    (lambda s: s + "    models: []\n", r"spec.yaml:11: models: duplicate key"),
    (lambda s: s.replace("resources: {cores: 2}", "resources: {cores: 2"), r"spec.yaml:\d+: not valid YAML"),
    (lambda s: s + "        priority_levels: 2\n        priority_queue: mine\n",
     r"spec.yaml:12: models\[1\].priority_queue: expected one of latte, triton, got 'mine'"),
    (lambda s: s + "        priority_queue: triton\n",
     r"spec.yaml:11: models\[1\].priority_queue: says whose queue holds priority_levels; set priority_levels: 2"),
    (lambda s: s + "        health_rss_growth_mib_per_min: 0\n",
     r"spec.yaml:11: models\[1\].health_rss_growth_mib_per_min: expected a number >= 0.001, got 0"),
    (lambda s: s.replace("        inputs: [{name: X", "        health_rss_growth_mib_per_min: 4\n        inputs: [{name: X"),
     r"spec.yaml:5: models\[0\].health_rss_growth_mib_per_min: only latte models are profiled and derived"),
])
def test_errors_point_at_the_line_and_key(write, edit, expected):
    with pytest.raises(SpecError, match=expected):
        load_spec(write(edit(GOOD)))


def test_a_latte_models_rss_growth_rule_is_read_and_absent_by_default(write):
    assert load_spec(write(GOOD)).models[1].health_rss_growth_mib_per_min is None
    spec = load_spec(write(GOOD + "        health_rss_growth_mib_per_min: 2.5\n"))
    assert spec.models[1].health_rss_growth_mib_per_min == 2.5


def test_priority_levels_go_to_lattes_queue_unless_the_spec_names_tritons(write):
    levels = GOOD + "        priority_levels: 2\n"
    assert load_spec(write(levels)).models[1].priority_queue == "latte"
    assert load_spec(write(levels + "        priority_queue: triton\n")).models[1].priority_queue == "triton"


def test_ensemble_step_without_model_key(write):
    text = GOOD + """\
    ensembles:
      - name: ens
        inputs: [{name: X, data_type: FP32, dims: [4]}]
        outputs: [{name: Y, data_type: FP32, dims: [4]}]
        steps:
          - {inputs: {X: X}, outputs: {Y: Y}}
"""
    with pytest.raises(SpecError, match=r"spec.yaml:16: ensembles\[0\].steps\[0\].model: missing"):
        load_spec(write(text))


def test_missing_spec_file(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "absent.yaml")
