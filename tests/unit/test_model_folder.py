"""Model folders: configs are checked by parsing them with Triton's ModelConfig protobuf before
anything is written, and a folder is written whole."""

import pytest

from latte.examples import EXAMPLES, model_context
from latte.generator.model_folder import render_model_config, write_model
from latte.generator.templates import TemplateError
from latte.generator.validate import InvalidConfig, model_config_class, parse_config


def test_example_configs_parse_as_triton_model_config():
    ModelConfig = model_config_class()
    for example in EXAMPLES.values():
        text = render_model_config(model_context(example, "onnx", "model.onnx"))
        config = parse_config(text)
        assert isinstance(config, ModelConfig)
        assert config.backend == "latte"
        assert config.max_batch_size == example.max_batch_size
        assert [i.name for i in config.input] == [t.name for t in example.inputs]
        assert config.input[0].allow_ragged_batch == example.inputs[0].ragged
        assert config.parameters["runtime"].string_value == "onnx"
        assert config.parameters["intra_op_threads"].string_value == "1"
        assert config.instance_group[0].kind == ModelConfig().instance_group.add().KIND_CPU


def test_a_missing_context_key_fails_the_render_instead_of_writing_blanks():
    context = model_context(EXAMPLES["mlp"], "onnx", "model.onnx")
    del context["max_batch_size"]
    with pytest.raises(TemplateError, match="max_batch_size"):
        render_model_config(context)


def test_a_malformed_user_template_names_file_and_line(tmp_path):
    (tmp_path / "config.pbtxt.j2").write_text('name: "{{ name }}"\n{% if %}\n')
    with pytest.raises(TemplateError, match=r"config.pbtxt.j2:2"):
        render_model_config(model_context(EXAMPLES["mlp"], "onnx", "model.onnx"), templates=tmp_path)


def test_text_triton_would_refuse_is_rejected():
    with pytest.raises(InvalidConfig, match="max_batch_sizes"):
        parse_config('name: "m"\nmax_batch_sizes: 4\n')


def test_a_model_folder_is_written_whole_replacing_an_earlier_one(tmp_path):
    source = tmp_path / "exported.onnx"
    source.write_bytes(b"onnx bytes")
    context = model_context(EXAMPLES["mlp"], "onnx", "model.onnx")
    stale = tmp_path / "repo" / context["name"] / "1" / "old.pt"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an earlier model file")
    model_dir = write_model(tmp_path / "repo", context, {"model.onnx": source}, warmup_files={"features": b"\0" * 64})
    assert sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file()) == [
        "1/model.onnx", "config.pbtxt", "warmup/features"]
    assert (model_dir / "1" / "model.onnx").read_bytes() == b"onnx bytes"


def test_a_config_triton_would_refuse_writes_nothing(tmp_path):
    context = model_context(EXAMPLES["mlp"], "onnx", "model.onnx")
    context["max_batch_size"] = "eight"
    with pytest.raises(InvalidConfig):
        write_model(tmp_path / "repo", context, {})
    assert not (tmp_path / "repo").exists()
