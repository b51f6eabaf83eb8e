"""Fusing ensembles: which steps latte runs as one model, what stays in Triton's ensemble and
why, `latte fuse` on hand-written repositories and `latte generate`'s fused output."""

import json
import shutil

import pytest

from latte.cli import main
from latte.generator.dag import EnsembleWiring, Interface, StepWiring, TensorInfo
from latte.generator.fuse import FuseError, StepSource, fuse_ensemble, fuse_repository, fusion_groups
from latte.generator.validate import parse_config_file, validate_repository

F32 = TensorInfo("TYPE_FP32", (4,))


def source(model, device="cpu", reason=None):
    interface = Interface(model, 8, {"x": F32}, {"y": F32})
    return StepSource(model=model, config={"name": model}, files={}, interface=interface, device=device,
                      reason=reason)


def chain(*models, extra=()):
    """An ensemble IN -> models[0] -> ... -> OUT; `extra` adds (model, input tensor, output tensor) steps."""
    steps, tensor = [], "IN"
    for i, model in enumerate(models):
        out = "OUT" if i == len(models) - 1 else f"t{i}"
        steps.append(StepWiring(model, {"x": tensor}, {"y": out}))
        tensor = out
    steps += [StepWiring(m, {"x": a}, {"y": b}) for m, a, b in extra]
    return EnsembleWiring("pipe", 8, {"IN": F32}, {"OUT": F32}, steps)


def test_steps_latte_can_run_together_become_one_group():
    wiring = chain("pre", "model", "post")
    groups, unfused = fusion_groups(wiring, {"pre": source("pre", None), "model": source("model"),
                                             "post": source("post", None)})
    assert groups == [[0, 1, 2]] and unfused == {}


def test_a_step_on_another_device_keeps_the_groups_apart():
    wiring = chain("pre", "cpu_model", "gpu_model", "post")
    sources = {"pre": source("pre", None), "cpu_model": source("cpu_model", "cpu"),
               "gpu_model": source("gpu_model", "gpu"), "post": source("post", None)}
    groups, unfused = fusion_groups(wiring, sources)
    assert groups == [[0, 1], [2, 3]] and unfused == {}


def test_steps_around_one_latte_cannot_run_are_not_fused_through_it():
    # a -> x -> b and a -> b: one model for a and b would wait on x, which waits on a.
    wiring = EnsembleWiring("pipe", 8, {"IN": F32}, {"OUT": F32}, [
        StepWiring("a", {"x": "IN"}, {"y": "t"}), StepWiring("x", {"x": "t"}, {"y": "u"}),
        StepWiring("b", {"x": "u", "z": "t"}, {"y": "OUT"})])
    sources = {"a": source("a"), "x": source("x", reason="backend 'tensorrt_plan' runs outside latte"),
               "b": source("b")}
    sources["b"].interface.inputs["z"] = F32
    fusion = fuse_ensemble(wiring, sources)
    assert fusion.fused == []
    alone = "no step next to it fuses with it, and a step alone gains nothing fused"
    assert fusion.unfused == {"a": alone, "x": "backend 'tensorrt_plan' runs outside latte", "b": alone}


def test_a_partly_fused_ensemble_calls_the_fused_group_as_one_step():
    wiring = chain("pre", "model", "other")
    sources = {"pre": source("pre", None), "model": source("model"),
               "other": source("other", reason="backend 'dali' runs outside latte")}
    fusion = fuse_ensemble(wiring, sources, taken=["pre", "model", "other"])
    (fused,) = fusion.fused
    assert fused.name == "pipe_fused" and fused.steps == ["pre", "model"] and not fusion.replaced
    assert [t["name"] for t in fused.context["inputs"]] == ["IN"]
    assert [t["name"] for t in fused.context["outputs"]] == ["t1"]
    assert fusion.steps == [{"model": "pipe_fused", "inputs": {"IN": "IN"}, "outputs": {"t1": "t1"}},
                            {"model": "other", "inputs": {"x": "t1"}, "outputs": {"y": "OUT"}}]
    assert fusion.summary() == ["pipe: fused pre -> model into latte model 'pipe_fused' (a step of ensemble 'pipe')",
                                "pipe: step 'other' not fused: backend 'dali' runs outside latte"]


@pytest.fixture
def hand_written(tmp_path):
    from latte.examples.pipeline import write_hand_written_repository

    return write_hand_written_repository(tmp_path / "repo", "latte")


def test_latte_fuse_replaces_the_ensemble_with_one_latte_model_of_its_name(hand_written, tmp_path, capsys):
    out = tmp_path / "fused"
    assert main(["fuse", str(hand_written), "--ensemble", "embed_text", "-o", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "embed_text: fused tokenize -> encoder -> normalize into latte model 'embed_text' (replaces the ensemble)",
        f"wrote {out}; validated"]
    configs = validate_repository(out)
    assert configs["embed_text"].backend == "latte" and configs["tokenize"].backend == "python"
    graph = json.loads((out / "embed_text" / "1" / "graph.json").read_text())
    assert [s["name"] for s in graph["steps"]] == ["tokenize", "encoder", "normalize"]
    assert "function" not in graph["steps"][0]  # the TritonPythonModel itself, unchanged
    step_file = out / "embed_text" / "1" / "steps" / "tokenize" / "1" / "model.py"
    assert step_file.read_text() == (hand_written / "tokenize" / "1" / "model.py").read_text()


def test_an_onnxruntime_step_becomes_a_latte_model_step(tmp_path):
    from latte.examples.pipeline import write_hand_written_repository

    repo = write_hand_written_repository(tmp_path / "repo", "onnxruntime")
    fuse_repository(repo, "embed_text", tmp_path / "fused")
    graph = json.loads((tmp_path / "fused" / "embed_text" / "1" / "graph.json").read_text())
    encoder = graph["steps"][1]["config"]
    assert encoder["backend"] == "latte" and encoder["parameters"]["runtime"] == {"string_value": "onnx"}
    assert encoder["input"][0]["allow_ragged_batch"] is True  # planned by its rows' lengths inside the graph


def test_latte_fuse_says_where_what_it_was_given_cannot_fuse(hand_written, tmp_path):
    with pytest.raises(FuseError, match=r"tokenize/config.pbtxt:\d+: platform: 'tokenize' is not an ensemble"):
        fuse_repository(hand_written, "tokenize", tmp_path / "a")
    with pytest.raises(FuseError, match="no model 'nope'"):
        fuse_repository(hand_written, "nope", tmp_path / "b")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    with pytest.raises(FuseError, match="the folder exists and is not empty"):
        fuse_repository(hand_written, "embed_text", tmp_path / "busy")
    config = hand_written / "encoder" / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "latte"', 'backend: "tensorrt"'))
    (hand_written / "normalize" / "config.pbtxt").write_text(
        (hand_written / "normalize" / "config.pbtxt").read_text().replace('backend: "python"', 'backend: "dali"'))
    with pytest.raises(FuseError) as refused:
        fuse_repository(hand_written, "embed_text", tmp_path / "c")
    assert str(refused.value) == (
        f"{hand_written}/embed_text/config.pbtxt:6: ensemble_scheduling: nothing to fuse (step 'tokenize': no step "
        "next to it fuses with it, and a step alone gains nothing fused; step 'encoder': backend 'tensorrt' runs "
        "outside latte; step 'normalize': backend 'dali' runs outside latte)")


def test_latte_fuse_keeps_the_ensemble_around_a_step_it_cannot_run(hand_written, tmp_path):
    config = hand_written / "normalize" / "config.pbtxt"
    config.write_text(config.read_text().replace('backend: "python"', 'backend: "dali"'))
    fusion = fuse_repository(hand_written, "embed_text", tmp_path / "fused")
    assert not fusion.replaced and fusion.unfused == {"normalize": "backend 'dali' runs outside latte"}
    configs = validate_repository(tmp_path / "fused")
    steps = [s.model_name for s in configs["embed_text"].ensemble_scheduling.step]
    assert steps == ["embed_text_fused", "normalize"] and configs["embed_text_fused"].backend == "latte"


def test_generate_fuses_each_ensemble_and_says_so(fused_pipelines):
    _, repo = fused_pipelines["branching"]
    config = parse_config_file(repo / "embed_and_tag" / "config.pbtxt")
    assert config.backend == "latte" and config.parameters["runtime"].string_value == "graph"
    graph = json.loads((repo / "embed_and_tag" / "1" / "graph.json").read_text())
    assert [s.get("function") for s in graph["steps"]] == ["tokenize", None, "normalize", None]
    assert {t["name"] for t in graph["outputs"]} == {"EMBEDDING", "NORM", "TOPICS"}


def test_the_image_pipelines_samples_travel_into_its_graph(fused_pipelines):
    _, repo = fused_pipelines["image"]
    graph = json.loads((repo / "classify_image" / "1" / "graph.json").read_text())
    assert len(graph["samples"]) == 16 and set(graph["samples"][0]["IMAGE"]) == {"b64", "shape"}


def test_a_spec_naming_a_function_its_file_lacks_is_refused_at_the_line(fused_pipelines, tmp_path):
    from latte.generator.generate import generate
    from latte.generator.yaml_lines import SpecError

    files, _ = fused_pipelines["text"]
    spec = tmp_path / "pipeline.yaml"
    text = (files / "pipeline.yaml").read_text().replace("function: tokenize", "function: tokenise")
    for name in ("tokenize.py", "normalize.py", "encoder.json", "samples.json"):
        shutil.copy(files / name, tmp_path / name)
    shutil.copytree(files / "sequence", tmp_path / "sequence")
    spec.write_text(text.replace(str(files), str(tmp_path)))
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "tokenise" in t)
    with pytest.raises(SpecError, match=rf"pipeline.yaml:{line}: models\[0\].function: tokenize.py defines no "
                                        "function 'tokenise'"):
        generate(spec, tmp_path / "repo")
