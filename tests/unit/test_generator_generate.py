"""`latte generate`: rendered repositories match reviewed golden configs and parse as Triton's."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from latte.cli import main
from latte.generator.dag import EnsembleError
from latte.generator.generate import generate
from latte.generator.validate import RepositoryError, parse_config, validate_repository

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture
def repo(sequence_pipeline, tmp_path):
    generate(sequence_pipeline / "pipeline.yaml", tmp_path / "repo")
    return tmp_path / "repo"


@pytest.fixture
def plain_repo(sequence_pipeline, tmp_path):
    generate(sequence_pipeline / "pipeline.yaml", tmp_path / "plain", fuse=False)
    return tmp_path / "plain"


def spec_with(sequence_pipeline, name, lines):
    """The pipeline spec with `lines` added to the encoder after its `slo_ms: 20`, written to `name`."""
    text = (sequence_pipeline / "pipeline.yaml").read_text()
    assert text.count("    slo_ms: 20\n") == 1
    path = sequence_pipeline / name
    path.write_text(text.replace("    slo_ms: 20\n", "    slo_ms: 20\n" + lines))
    return path


@pytest.mark.parametrize("model", ["embed_text", "encoder", "tokenize", "normalize"])
def test_rendered_config_matches_golden_and_parses(repo, model):
    text = (repo / model / "config.pbtxt").read_text()
    assert text == (GOLDEN / f"{model}.pbtxt").read_text()
    config = parse_config(text, model)
    assert config.name == model


def test_health_rules_come_from_the_slo_and_the_spec_and_overrides_win(sequence_pipeline, tmp_path):
    path = spec_with(sequence_pipeline, "health.yaml",
                     "    health_rss_growth_mib_per_min: 4\n    overrides: {parameters: {execute_timeout_s: 30}}\n")
    generate(path, tmp_path / "repo", fuse=False)
    params = {k: v.string_value for k, v in
              parse_config((tmp_path / "repo" / "encoder" / "config.pbtxt").read_text()).parameters.items()}
    assert params["health_p99_slo_ms"] == "20" and params["health_rss_growth_mib_per_min"] == "4"
    assert params["execute_timeout_s"] == "30"
    # A python step is not latte's: no rules.
    tokenize = parse_config((tmp_path / "repo" / "tokenize" / "config.pbtxt").read_text())
    assert not any(key.startswith(("health_", "execute_", "rejuvenate_")) for key in tokenize.parameters)


def test_without_fusing_the_ensemble_is_rendered_as_written(plain_repo):
    text = (plain_repo / "embed_text" / "config.pbtxt").read_text()
    assert text == (GOLDEN / "embed_text.ensemble.pbtxt").read_text()
    assert not (plain_repo / "embed_text" / "1" / "graph.json").exists()


def test_repository_layout_has_versions_model_files_and_warmup(repo):
    assert (repo / "encoder" / "1" / "model.onnx").stat().st_size > 1000
    assert (repo / "tokenize" / "1" / "model.py").read_text().startswith('"""Pre-process step')
    assert (repo / "embed_text" / "1").is_dir()
    # One row of 16 int64 token ids, valid ids for the encoder's vocabulary.
    tokens = np.frombuffer((repo / "encoder" / "warmup" / "tokens").read_bytes(), dtype=np.int64)
    assert tokens.shape == (16,) and tokens.min() >= 1 and tokens.max() < 1000
    configs = validate_repository(repo)
    assert configs["embed_text"].backend == "latte"  # the ensemble, fused
    assert (repo / "embed_text" / "1" / "steps" / "encoder" / "1" / "model.onnx").is_file()


def test_overrides_win_over_derived_values(sequence_pipeline, tmp_path):
    path = spec_with(sequence_pipeline, "override.yaml",
                     "    overrides: {max_batch_size: 4, instance_count: 2, "
                     "dynamic_batching: {max_queue_delay_microseconds: 100}, parameters: {pad_value: 7}}\n")
    generate(path, tmp_path / "repo")
    generate(path, tmp_path / "plain", fuse=False)
    config = parse_config((tmp_path / "repo" / "encoder" / "config.pbtxt").read_text())
    assert config.max_batch_size == 4
    assert config.instance_group[0].count == 2
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert config.max_batch_size == 4 and config.parameters["bucket_edges"].string_value  # derived value kept
    assert config.parameters["pad_value"].string_value == "7"
    # Triton's ensemble batches no more than its smallest step takes.
    assert parse_config((tmp_path / "plain" / "embed_text" / "config.pbtxt").read_text()).max_batch_size == 4
    # Fused, the encoder step keeps its overrides and runs at most 4 rows a call inside the graph,
    # while the fused model's own settings come from its own profile (the spec's embed_text.json,
    # batches up to 32) against the ensemble's SLO, not from the encoder's overrides.
    graph = json.loads((tmp_path / "repo" / "embed_text" / "1" / "graph.json").read_text())
    encoder = next(step for step in graph["steps"] if step["name"] == "encoder")["config"]
    assert encoder["max_batch_size"] == 4 and encoder["parameters"]["pad_value"] == {"string_value": "7"}
    fused = parse_config((tmp_path / "repo" / "embed_text" / "config.pbtxt").read_text())
    assert fused.max_batch_size == 32 and fused.instance_group[0].count == 2
    assert fused.dynamic_batching.max_queue_delay_microseconds == 0


def test_priority_levels_render_lattes_queue_that_the_backend_loads(sequence_pipeline, tmp_path):
    from google.protobuf.json_format import MessageToDict

    from latte.backend.config import parse_model_config

    path = spec_with(sequence_pipeline, "priorities.yaml", "    priority_levels: 2\n")
    generate(path, tmp_path / "repo")
    config = parse_config((tmp_path / "repo" / "encoder" / "config.pbtxt").read_text())
    # Triton's queue holds neither priorities nor a policy, so it cannot stall; latte's holds both.
    assert config.dynamic_batching.priority_levels == 0
    assert not config.dynamic_batching.HasField("default_queue_policy")
    assert config.dynamic_batching.max_queue_delay_microseconds == 0
    serving = parse_model_config(MessageToDict(config, preserving_proto_field_name=True),
                                 tmp_path / "repo" / "encoder", "1").serving
    assert serving.async_execute and serving.scheduler == "affinity"
    # Whole batches of the rendered size: b x the batches that fit in the SLO after the first.
    assert serving.max_queue_size >= config.max_batch_size and serving.max_queue_size % config.max_batch_size == 0


def test_multi_threaded_override_beyond_cores_is_refused(sequence_pipeline, tmp_path):
    path = spec_with(sequence_pipeline, "threads.yaml",
                     "    overrides: {instance_count: 2, parameters: {intra_op_threads: 2}}\n")
    with pytest.raises(ValueError, match=r"threads.yaml:\d+: models\[1\].overrides: 2 instance\(s\) x "
                                         r"intra_op_threads 2 exceed the 2 core.*multi-threaded instances must fit"):
        generate(path, tmp_path / "repo")


def test_single_instance_behind_a_queue_policy_is_not_written(sequence_pipeline, tmp_path):
    path = spec_with(sequence_pipeline, "one_instance.yaml",
                     "    overrides: {instance_count: 1, dynamic_batching: {default_queue_policy: {max_queue_size: 32}}}\n")
    with pytest.raises(ValueError, match=r"encoder/config.pbtxt not written: encoder: one instance with "
                                         r"dynamic_batching priority_levels or a default_queue_policy limit "
                                         r"stalls up to 500 ms"):
        generate(path, tmp_path / "repo")
    assert not (tmp_path / "repo" / "encoder").exists()


def test_single_threaded_instances_beyond_cores_are_generated(sequence_pipeline, tmp_path):
    path = spec_with(sequence_pipeline, "instances.yaml", "    overrides: {instance_count: 3}\n")
    generate(path, tmp_path / "repo")
    config = parse_config((tmp_path / "repo" / "encoder" / "config.pbtxt").read_text())
    assert config.instance_group[0].count == 3


def test_ensemble_errors_name_the_spec_line(sequence_pipeline, tmp_path):
    spec = (sequence_pipeline / "pipeline.yaml").read_text()
    broken = spec.replace("{RAW: raw_embedding}", "{RAW: raw_embeding}")
    path = sequence_pipeline / "broken.yaml"
    path.write_text(broken)
    line = next(i for i, text in enumerate(broken.splitlines(), 1) if "raw_embeding" in text)
    with pytest.raises(EnsembleError) as info:
        generate(path, tmp_path / "repo")
    text = str(info.value)
    assert f"broken.yaml:{line}: ensembles[0].steps[2].inputs.RAW: step input tensor 'raw_embeding' is never produced" in text
    assert "step output tensor 'raw_embedding' is never consumed" in text
    assert not (tmp_path / "repo").exists()


def test_user_templates_replace_the_bundled_ones(sequence_pipeline, tmp_path):
    from latte.generator.templates import bundled_templates

    mine = tmp_path / "templates"
    mine.mkdir()
    text = (bundled_templates() / "ensemble.pbtxt.j2").read_text()
    (mine / "ensemble.pbtxt.j2").write_text(text.replace('platform: "ensemble"',
                                                         'platform: "ensemble"\n# reviewed by the serving team'))
    generate(sequence_pipeline / "pipeline.yaml", tmp_path / "repo", templates=mine, fuse=False)
    assert "# reviewed by the serving team" in (tmp_path / "repo" / "embed_text" / "config.pbtxt").read_text()
    assert "# reviewed" not in (tmp_path / "repo" / "encoder" / "config.pbtxt").read_text()


def test_validate_reports_each_broken_part(plain_repo):
    repo = plain_repo
    (repo / "tokenize" / "1" / "model.py").unlink()
    (repo / "encoder" / "warmup" / "tokens").unlink()
    ensemble = repo / "embed_text" / "config.pbtxt"
    ensemble.write_text(ensemble.read_text().replace("dims: [ 32 ]", "dims: [ 16 ]"))
    shutil.copytree(repo / "normalize", repo / "copy")
    with pytest.raises(RepositoryError) as info:
        validate_repository(repo)
    problems = "\n".join(info.value.problems)
    assert "tokenize/config.pbtxt:2: backend: a python-backend model needs" in problems
    assert ".inputs['tokens'].input_data_file: reads warmup/tokens, which does not exist" in problems
    assert "embed_text/config.pbtxt:10: output['EMBEDDING']: tensor 'EMBEDDING' has dims [32]" in problems
    assert "copy/config.pbtxt:1: name: 'normalize' differs from its folder 'copy'" in problems


def test_validate_names_the_line_of_a_syntax_error(repo):
    config = repo / "encoder" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 16", "max_batch_sise: 16"))
    with pytest.raises(RepositoryError, match=r"encoder/config.pbtxt:3:\d+: .*max_batch_sise"):
        validate_repository(repo)


def test_cli_validate_exit_codes(plain_repo, capsys):
    repo = plain_repo
    assert main(["validate", str(repo)]) == 0
    assert "4 model(s), 1 ensemble(s): valid" in capsys.readouterr().out
    (repo / "normalize" / "1" / "model.py").unlink()
    assert main(["validate", str(repo)]) == 1
    assert "normalize/config.pbtxt:2: backend: a python-backend model needs" in capsys.readouterr().err


def test_cli_validate_warns_on_one_instance_behind_a_queue_policy(repo, capsys):
    config = repo / "encoder" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 2", "count: 1").replace(
        "dynamic_batching {", "dynamic_batching {\n  default_queue_policy { max_queue_size: 32 }", 1))
    assert main(["validate", str(repo)]) == 0
    err = capsys.readouterr().err
    assert ("warning: encoder: one instance with dynamic_batching priority_levels or a default_queue_policy "
            "limit stalls up to 500 ms") in err
    config.write_text(config.read_text().replace("count: 1", "count: 2"))
    assert main(["validate", str(repo)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_cli_generate_prints_the_reasons(sequence_pipeline, tmp_path, capsys):
    assert main(["generate", str(sequence_pipeline / "pipeline.yaml"), "-o", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "max_batch_size 16: the largest batch with 2 x P99" in out
    assert "validated" in out


@pytest.mark.parametrize("command", ["profile", "generate", "validate", "verify"])
def test_every_generator_command_has_help_with_an_example(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out and f"latte {command}" in out


def test_cli_spec_errors_are_one_clear_line(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("models:\n  - name: m\n    file: missing.onnx\n    slo_ms: 5\n")
    assert main(["generate", str(spec), "-o", str(tmp_path / "repo")]) == 1
    err = capsys.readouterr().err
    assert "spec.yaml:3: models[0].file: file" in err and "missing.onnx does not exist" in err


def test_a_kept_profile_is_reused_only_when_its_sweep_reached_the_slo(sequence_pipeline, tmp_path, monkeypatch):
    import latte.generator.profile as profiling
    from latte.generator.generate import load_or_profile
    from latte.generator.profile_data import Profile
    from latte.generator.spec import ModelEntry

    kept = Profile.load(sequence_pipeline / "encoder.json")
    kept.max_latency_ms = 10.0            # swept up to 10 ms a call: enough for an SLO of 20 ms, not 40
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    kept.save(profiles / "encoder.json")
    asked = []
    monkeypatch.setattr(profiling, "profile_model", lambda file, options: asked.append(options) or kept)
    lines = []
    entry = ModelEntry(name="encoder", backend="latte", file=tmp_path / "model.onnx", path=(), slo_ms=20.0)
    entry.file.touch()
    (profiles / "encoder.json").touch()   # newer than the model file
    load_or_profile(entry, profiles, lines.append)
    assert asked == [] and lines == [f"encoder: reusing profile {profiles / 'encoder.json'}"]

    entry.slo_ms = 40.0
    load_or_profile(entry, profiles, lines.append)
    assert [options.ceiling_ms for options in asked] == [20.0]
    assert lines[1] == (f"encoder: profile {profiles / 'encoder.json'} stops at 10 ms a call, short of this "
                        "SLO's 20 ms")


def test_a_spec_with_gpus_profiles_its_models_on_the_gpu_where_they_compute_there(sequence_pipeline, tmp_path,
                                                                                 monkeypatch):
    import latte.generator.generate as generating
    import latte.generator.profile as profiling
    from latte.generator.generate import load_or_profile, profile_device
    from latte.generator.profile_data import Profile
    from latte.generator.spec import ModelEntry

    lines = []
    monkeypatch.setattr(generating, "_runs_on_cuda", lambda runtime: runtime != "onnx")
    assert profile_device(0, "torchscript", "encoder", lines.append) == "cpu" and lines == []
    assert profile_device(1, "torchscript", "encoder", lines.append) == "cuda:0"
    assert profile_device(1, "onnx", "encoder", lines.append) == "cpu"
    assert lines == ["encoder: profiled on the CPU although the spec gives 1 GPU(s): no CUDA device here that its "
                     "onnx runtime computes on, so its instances are KIND_CPU"]

    # A kept profile taken on another device is not reused: the model is profiled where it runs.
    kept = Profile.load(sequence_pipeline / "encoder.json")
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    kept.save(profiles / "encoder.json")
    asked = []
    monkeypatch.setattr(profiling, "profile_model", lambda file, options: asked.append(options) or kept)
    entry = ModelEntry(name="encoder", backend="latte", file=tmp_path / "model.pt", path=(), slo_ms=20.0)
    entry.file.touch()
    (profiles / "encoder.json").touch()
    load_or_profile(entry, profiles, lines.append, device="cuda:0")
    assert [options.device for options in asked] == ["cuda:0"]
    assert lines[-2] == f"encoder: profile {profiles / 'encoder.json'} was taken on cpu; this spec's model runs on cuda:0"
