"""`latte validate`: every problem in a model repository is reported as file:line on the file that is wrong."""

from pathlib import Path

import pytest

from latte.cli import main
from latte.generator.validate import RepositoryError, validate_repository

PRE = """\
name: "pre"
backend: "python"
max_batch_size: 8
input {
  name: "TEXT"
  data_type: TYPE_STRING
  dims: [ 1 ]
}
output {
  name: "TOKENS"
  data_type: TYPE_INT64
  dims: [ -1 ]
}
"""

ENCODER = """\
name: "encoder"
backend: "latte"
max_batch_size: 8
input {
  name: "tokens"
  data_type: TYPE_INT64
  dims: [ -1 ]
}
output {
  name: "embedding"
  data_type: TYPE_FP32
  dims: [ 4 ]
}
parameters {
  key: "model_file"
  value: { string_value: "model.onnx" }
}
model_warmup {
  name: "sample"
  batch_size: 1
  inputs {
    key: "tokens"
    value {
      data_type: TYPE_INT64
      dims: [ 4 ]
      input_data_file: "tokens"
    }
  }
}
"""

ENSEMBLE = """\
name: "ens"
platform: "ensemble"
max_batch_size: 8
input { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }
output { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 4 ] }
ensemble_scheduling {
  step {
    model_name: "pre"
    model_version: -1
    input_map { key: "TEXT" value: "TEXT" }
    output_map { key: "TOKENS" value: "tokens" }
  }
  step {
    model_name: "encoder"
    model_version: -1
    input_map { key: "tokens" value: "tokens" }
    output_map { key: "embedding" value: "EMBEDDING" }
  }
}
"""

MODEL_FILE_KEY = 'key: "model_file"'
TOKENS_KEY = 'key: "tokens"'


@pytest.fixture
def repo(tmp_path):
    """A sound repository: a python pre-process step, a latte encoder, and the ensemble joining them."""
    root = tmp_path / "repo"
    for name, text in {"pre": PRE, "encoder": ENCODER, "ens": ENSEMBLE}.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(text)
    (root / "pre" / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (root / "encoder" / "1" / "model.onnx").write_bytes(b"onnx")
    (root / "encoder" / "warmup").mkdir()
    (root / "encoder" / "warmup" / "tokens").write_bytes(bytes(32))
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def line_of(path: Path, fragment: str, after: str = "") -> int:
    """The 1-based line of the first `fragment` in the file that comes after the line holding `after`."""
    lines = path.read_text().splitlines()
    start = next(i for i, text in enumerate(lines) if after in text)
    return next(i for i, text in enumerate(lines[start:], start + 1) if fragment in text)


def problems_of(repo: Path) -> list:
    with pytest.raises(RepositoryError) as info:
        validate_repository(repo)
    return info.value.problems


def test_a_sound_repository_validates(repo):
    configs = validate_repository(repo)
    assert sorted(configs) == ["encoder", "ens", "pre"]
    assert configs["ens"].platform == "ensemble"


def test_a_syntax_error_names_its_line_and_column(repo):
    config = repo / "encoder" / "config.pbtxt"
    edit(config, "max_batch_size: 8", "max_batch_sise: 8")
    problem = problems_of(repo)[0]
    assert problem.startswith(f"{config}:3:1: ")
    assert "max_batch_sise" in problem


def test_a_name_that_differs_from_its_folder_names_the_name_line(repo):
    config = repo / "pre" / "config.pbtxt"
    config.write_text("# the pre-process step\n" + PRE.replace('name: "pre"', 'name: "tokenizer"'))
    # The ensemble's step then names a model the repository lacks; that is reported too.
    assert f"{config}:2: name: 'tokenizer' differs from its folder 'pre'" in problems_of(repo)


def test_a_missing_python_model_file_names_the_backend_line(repo):
    (repo / "pre" / "1" / "model.py").unlink()
    assert problems_of(repo) == [f"{repo / 'pre' / 'config.pbtxt'}:2: backend: a python-backend model needs "
                                 f"{repo / 'pre' / '1' / 'model.py'}, which does not exist"]


def test_a_missing_model_file_names_the_parameter_line(repo):
    (repo / "encoder" / "1" / "model.onnx").unlink()
    config = repo / "encoder" / "config.pbtxt"
    assert problems_of(repo) == [f"{config}:{line_of(config, MODEL_FILE_KEY)}: parameters['model_file']: "
                                 f"names 'model.onnx', which is not in {repo / 'encoder' / '1'}/"]


def test_a_missing_warmup_file_names_the_input_data_file_line(repo):
    (repo / "encoder" / "warmup" / "tokens").unlink()
    config = repo / "encoder" / "config.pbtxt"
    assert problems_of(repo) == [
        f"{config}:{line_of(config, 'input_data_file')}: model_warmup['sample'].inputs['tokens'].input_data_file: "
        f"reads warmup/tokens, which does not exist in {repo / 'encoder'}/"]


def test_a_dtype_changed_in_a_step_model_is_reported_in_that_models_file(repo):
    encoder = repo / "encoder" / "config.pbtxt"
    edit(encoder, "data_type: TYPE_INT64", "data_type: TYPE_INT32")
    pre, ensemble = repo / "pre" / "config.pbtxt", repo / "ens" / "config.pbtxt"
    assert problems_of(repo) == [
        f"{encoder}:{line_of(encoder, 'TYPE_INT32')}: input['tokens'].data_type: tensor 'tokens' is TYPE_INT64 at "
        f"{pre}:{line_of(pre, 'TYPE_INT64')}: output['TOKENS'].data_type but TYPE_INT32 here (wired at "
        f"{ensemble}:{line_of(ensemble, TOKENS_KEY)}: ensemble_scheduling.step[1].input_map['tokens'])"]


def test_a_step_output_that_disagrees_with_the_ensemble_output_names_both_lines(repo):
    encoder = repo / "encoder" / "config.pbtxt"
    edit(encoder, "dims: [ 4 ]", "dims: [ 8 ]")
    ensemble = repo / "ens" / "config.pbtxt"
    # Reported where the tensor is received (the ensemble's own output), naming the line that sends it.
    [problem] = problems_of(repo)
    assert problem == (f"{ensemble}:5: output['EMBEDDING']: tensor 'EMBEDDING' has dims [8] at "
                       f"{encoder}:{line_of(encoder, 'dims: [ 8 ]')}: output['embedding'].dims but [4] here")


def test_dims_changed_in_the_ensemble_are_reported_in_the_ensembles_file(repo):
    ensemble = repo / "ens" / "config.pbtxt"
    edit(ensemble, "dims: [ 4 ]", "dims: [ 16 ]")
    [problem] = problems_of(repo)
    assert problem.startswith(f"{ensemble}:5: output['EMBEDDING']: tensor 'EMBEDDING' has dims [4] at ")
    assert problem.endswith("but [16] here")


def test_wiring_problems_name_the_ensemble_line(repo):
    ensemble = repo / "ens" / "config.pbtxt"
    edit(ensemble, 'model_name: "encoder"', 'model_name: "encodr"')
    edit(ensemble, 'input_map { key: "TEXT" value: "TEXT" }', 'input_map { key: "TEXT" value: "TXT" }')
    problems = problems_of(repo)
    assert (f"{ensemble}:{line_of(ensemble, 'encodr')}: ensemble_scheduling.step[1].model_name: model 'encodr' "
            "is not defined (known: encoder, ens, pre)") in problems
    assert (f"{ensemble}:{line_of(ensemble, 'TXT')}: ensemble_scheduling.step[0].input_map['TEXT']: step input "
            "tensor 'TXT' is never produced: no step output or ensemble input has that name") in problems
    assert (f"{ensemble}:4: input['TEXT']: ensemble input tensor 'TEXT' is never consumed by a step or an "
            "ensemble output") in problems


def test_a_step_written_as_a_list_is_located_too(repo):
    ensemble = repo / "ens" / "config.pbtxt"
    ensemble.write_text(ENSEMBLE.replace("  step {\n    model_name: \"pre\"", "  step: [ {\n    model_name: \"pre\"")
                        .replace("  }\n  step {", "  }, {").replace("  }\n}\n", "  } ]\n}\n")
                        .replace('key: "tokens" value: "tokens"', 'key: "tokens" value: "tokenz"'))
    problems = problems_of(repo)
    assert (f"{ensemble}:{line_of(ensemble, 'tokenz')}: ensemble_scheduling.step[1].input_map['tokens']: "
            "step input tensor 'tokenz' is never produced") in "\n".join(problems)


def test_cli_validate_prints_each_problem_with_its_line(repo, capsys):
    assert main(["validate", str(repo)]) == 0
    (repo / "pre" / "1" / "model.py").unlink()
    assert main(["validate", str(repo)]) == 1
    err = capsys.readouterr().err
    assert f"{repo}: 1 problem(s)" in err
    assert f"  {repo / 'pre' / 'config.pbtxt'}:2: backend: a python-backend model needs" in err


def test_a_model_with_sessions_on_two_instances_validates_with_a_warning(repo, capsys):
    config = repo / "encoder" / "config.pbtxt"
    edit(config, 'parameters {\n  key: "model_file"',
         'parameters {\n  key: "session_input"\n  value: { string_value: "tokens" }\n}\nparameters {\n  key: "model_file"')
    assert main(["validate", str(repo)]) == 0
    assert "warning" not in capsys.readouterr().err  # one instance (no instance_group) holds every session
    config.write_text(config.read_text() + "instance_group [ { count: 2, kind: KIND_CPU } ]\n")
    assert main(["validate", str(repo)]) == 0
    err = capsys.readouterr().err
    assert ("warning: encoder: sessions (session_input) live in one model instance, but 2 instances share the "
            "requests") in err


# Triton 2.51's batcher stall (docs/backend.md, Priorities; benchmarks/batcher_stall.py measures it).
STALL_WARNING = "one instance with dynamic_batching priority_levels or a default_queue_policy limit stalls up to 500 ms"


def rendered_priorities_config(priority_queue: str) -> str:
    """What `latte generate` renders for a two-priority model with a 50 ms SLO on 2 cores."""
    from latte.generator.derive import derive
    from latte.generator.model_folder import render_model_config
    from latte.generator.profile_data import Point, Profile

    tensors = {"inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
               "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]}
    points = [Point(b, None, 1.0, 1.0, 1.0, 1000 * b) for b in (1, 2, 4, 8)]
    profile = Profile("echo.onnx", "onnx", "cpu", 1, tensors["inputs"], tensors["outputs"], points)
    d = derive(profile, slo_ms=50, cores=2, priority_levels=2, priority_queue=priority_queue)
    return render_model_config({"name": "rendered", "backend": "python", "max_batch_size": d.max_batch_size,
                                **tensors, "dynamic_batching": d.dynamic_batching,
                                "instance_groups": d.instance_groups(), "parameters": {}})


def test_the_stall_warning_flags_one_instance_behind_priority_levels_and_not_the_rendered_configs():
    from latte.generator.validate import batcher_stall, parse_config

    hand_written = parse_config('name: "hand_written"\nbackend: "python"\nmax_batch_size: 8\n'
                                "dynamic_batching { priority_levels: 2 default_priority_level: 2 }\n"
                                "instance_group [ { count: 1 kind: KIND_CPU } ]\n")
    assert STALL_WARNING in batcher_stall(hand_written)
    in_tritons_queue = parse_config(rendered_priorities_config("triton"))
    assert in_tritons_queue.dynamic_batching.priority_levels == 2   # the rendered config does use priorities
    assert batcher_stall(in_tritons_queue) is None
    in_lattes_queue = parse_config(rendered_priorities_config("latte"))
    assert in_lattes_queue.dynamic_batching.priority_levels == 0    # Triton's queue holds no priorities
    assert batcher_stall(in_lattes_queue) is None


def test_cli_validate_warns_on_one_instance_behind_priority_levels(repo, capsys):
    config = repo / "encoder" / "config.pbtxt"
    config.write_text(config.read_text() + "dynamic_batching { priority_levels: 2 default_priority_level: 2 }\n")
    assert main(["validate", str(repo)]) == 0
    assert f"warning: encoder: {STALL_WARNING}" in capsys.readouterr().err
    config.write_text(config.read_text() + "instance_group [ { count: 2, kind: KIND_CPU } ]\n")
    assert main(["validate", str(repo)]) == 0
    assert "warning" not in capsys.readouterr().err
