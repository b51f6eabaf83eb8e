"""Several versions of one model, Triton's version_policy and response cache, from the pipeline spec."""

import shutil

import pytest

from latte.cli import main
from latte.generator.generate import generate
from latte.generator.spec import SpecError
from latte.generator.validate import RepositoryError, parse_config, validate_repository

TWO_VERSIONS = """\
    versions:
      - {version: 1, file: sequence/model.onnx}
      - {version: 2, file: sequence/model_v2.onnx}
"""


def spec_with(pipeline, name: str, encoder_keys: str, versions: str = TWO_VERSIONS):
    """The example pipeline whose encoder lists `versions` instead of one file, plus `encoder_keys`."""
    shutil.copy(pipeline / "sequence" / "model.onnx", pipeline / "sequence" / "model_v2.onnx")
    text = (pipeline / "pipeline.yaml").read_text()
    text = text.replace("    file: sequence/model.onnx\n", versions + encoder_keys)
    path = pipeline / name
    path.write_text(text)
    return path


def test_two_versions_latest_policy_and_cache_render_and_validate(sequence_pipeline, tmp_path):
    spec = spec_with(sequence_pipeline, "versions.yaml", "    version_policy: {latest: 2}\n    response_cache: true\n")
    generate(spec, tmp_path / "repo")

    encoder = tmp_path / "repo" / "encoder"
    # Each version folder holds its own file under the one name the config's model_file gives.
    assert (encoder / "1" / "model.onnx").read_bytes() == (sequence_pipeline / "sequence" / "model.onnx").read_bytes()
    assert (encoder / "2" / "model.onnx").read_bytes() == (sequence_pipeline / "sequence" / "model_v2.onnx").read_bytes()
    config = parse_config((encoder / "config.pbtxt").read_text())
    assert config.version_policy.latest.num_versions == 2
    assert config.response_cache.enable
    # A model that does not ask for either keeps Triton's defaults (latest 1, no cache).
    tokenize = parse_config((tmp_path / "repo" / "tokenize" / "config.pbtxt").read_text())
    assert not tokenize.HasField("version_policy") and not tokenize.response_cache.enable
    assert "encoder" in validate_repository(tmp_path / "repo")


@pytest.mark.parametrize("policy, field, expected", [
    ("all", "all", None),
    ("{specific: [2]}", "specific", [2]),
])
def test_all_and_specific_policies(sequence_pipeline, tmp_path, policy, field, expected):
    spec = spec_with(sequence_pipeline, f"policy_{field}.yaml", f"    version_policy: {policy}\n")
    generate(spec, tmp_path / "repo")
    config = parse_config((tmp_path / "repo" / "encoder" / "config.pbtxt").read_text())
    assert config.version_policy.WhichOneof("policy_choice") == field
    if expected is not None:
        assert list(config.version_policy.specific.versions) == expected


def test_specific_policy_must_name_listed_versions(sequence_pipeline, tmp_path):
    spec = spec_with(sequence_pipeline, "unlisted.yaml", "    version_policy: {specific: [1, 3]}\n")
    line = next(i for i, text in enumerate(spec.read_text().splitlines(), 1) if "specific" in text)
    with pytest.raises(SpecError, match=rf"unlisted.yaml:{line}: models\[1\].version_policy.specific\[1\]: "
                                        r"version 3 is not among the model's versions \(1, 2\)"):
        generate(spec, tmp_path / "repo")


def test_versions_of_different_formats_are_refused(sequence_pipeline, tmp_path):
    (sequence_pipeline / "sequence" / "model_v2.pt").write_bytes(b"not read")
    versions = TWO_VERSIONS.replace("model_v2.onnx", "model_v2.pt")
    spec = spec_with(sequence_pipeline, "mixed.yaml", "", versions=versions)
    with pytest.raises(SpecError, match=r"models\[1\].versions\[1\].file: model_v2.pt differs in extension"):
        generate(spec, tmp_path / "repo")


def test_file_and_versions_together_are_refused(sequence_pipeline, tmp_path):
    spec = spec_with(sequence_pipeline, "both.yaml", "    file: sequence/model.onnx\n")
    with pytest.raises(SpecError, match="either a file or a list of versions"):
        generate(spec, tmp_path / "repo")


def test_validate_names_a_missing_version_folder(sequence_pipeline, tmp_path, capsys):
    spec = spec_with(sequence_pipeline, "specific.yaml", "    version_policy: {specific: [1, 2]}\n")
    generate(spec, tmp_path / "repo")
    encoder = tmp_path / "repo" / "encoder"
    shutil.rmtree(encoder / "2")
    with pytest.raises(RepositoryError) as info:
        validate_repository(tmp_path / "repo")
    config = encoder / "config.pbtxt"
    line = next(n for n, text in enumerate(config.read_text().splitlines(), 1) if text.startswith("version_policy"))
    assert info.value.problems == [f"{config}:{line}: version_policy: lists version 2, but {encoder}/2/ "
                                   "does not exist (version folders: 1)"]
    assert main(["validate", str(tmp_path / "repo")]) == 1
    assert f"{config}:{line}: version_policy: lists version 2" in capsys.readouterr().err


def test_validate_counts_folders_against_the_latest_policy(sequence_pipeline, tmp_path):
    spec = spec_with(sequence_pipeline, "latest.yaml", "    version_policy: {latest: 2}\n")
    generate(spec, tmp_path / "repo")
    encoder = tmp_path / "repo" / "encoder"
    (encoder / "2" / "model.onnx").unlink()     # an empty version folder: Triton would fail to load it
    with pytest.raises(RepositoryError, match=r"encoder/config.pbtxt:\d+: parameters\['model_file'\]: names 'model.onnx', "
                                                   r"which is not in .*encoder/2/"):
        validate_repository(tmp_path / "repo")
    shutil.rmtree(encoder / "2")
    with pytest.raises(RepositoryError, match=r"encoder/config.pbtxt:\d+: version_policy: serves the latest 2 versions, but only 1 version "
                                              r"folder\(s\) exist \(1\)"):
        validate_repository(tmp_path / "repo")


def test_response_cache_is_refused_on_a_model_with_sessions(sequence_pipeline, tmp_path):
    spec = spec_with(sequence_pipeline, "sessions.yaml",
                     "    response_cache: true\n    overrides: {parameters: {session_input: tokens}}\n")
    with pytest.raises(SpecError, match=r"models\[1\].response_cache: a model with sessions \(session_input\) "
                                        "answers the same inputs differently per session"):
        generate(spec, tmp_path / "repo")
