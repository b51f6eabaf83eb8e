"""Each class of ensemble wiring error, found and located."""

import pytest

from latte.generator.dag import EnsembleWiring, Interface, StepWiring, TensorInfo, check_ensemble, shapes_agree

FP32 = lambda *dims: TensorInfo("TYPE_FP32", tuple(dims))  # noqa: E731
INT64 = lambda *dims: TensorInfo("TYPE_INT64", tuple(dims))  # noqa: E731

MODELS = {
    "pre": Interface("pre", 8, {"TEXT": TensorInfo("TYPE_STRING", (1,))}, {"TOKENS": INT64(-1)}),
    "encoder": Interface("encoder", 32, {"tokens": INT64(-1)}, {"embedding": FP32(32)}),
    "post": Interface("post", 8, {"EMB": FP32(32)}, {"SCORE": FP32(1)}),
    "small": Interface("small", 2, {"EMB": FP32(32)}, {"SCORE": FP32(1)}),
}


def pipeline(**changes):
    steps = changes.pop("steps", [
        StepWiring("pre", {"TEXT": "TEXT"}, {"TOKENS": "tokens"}),
        StepWiring("encoder", {"tokens": "tokens"}, {"embedding": "emb"}),
        StepWiring("post", {"EMB": "emb"}, {"SCORE": "SCORE"}),
    ])
    fields = {"name": "ens", "max_batch_size": 8, "inputs": {"TEXT": TensorInfo("TYPE_STRING", (1,))},
              "outputs": {"SCORE": FP32(1)}, "steps": steps}
    fields.update(changes)
    return EnsembleWiring(**fields)


def problems(ensemble):
    return check_ensemble(ensemble, MODELS, lambda path: "/".join(str(p) for p in path))


def test_a_sound_pipeline_has_no_problems():
    assert problems(pipeline()) == []


def test_fan_out_and_fan_in_are_allowed():
    two = Interface("join", 8, {"A": FP32(1), "B": FP32(1)}, {"OUT": FP32(1)})
    models = {**MODELS, "join": two}
    ens = pipeline(outputs={"OUT": FP32(1)}, steps=[
        StepWiring("pre", {"TEXT": "TEXT"}, {"TOKENS": "tokens"}),
        StepWiring("encoder", {"tokens": "tokens"}, {"embedding": "emb"}),
        StepWiring("post", {"EMB": "emb"}, {"SCORE": "s1"}),
        StepWiring("post", {"EMB": "emb"}, {"SCORE": "s2"}),
        StepWiring("join", {"A": "s1", "B": "s2"}, {"OUT": "OUT"}),
    ])
    assert check_ensemble(ens, models, str) == []


def test_unknown_model():
    found = problems(pipeline(steps=[StepWiring("nope", {"TEXT": "TEXT"}, {"SCORE": "SCORE"})]))
    assert any(p.startswith("steps/0/model: model 'nope' is not defined") for p in found)


def test_step_input_missing_on_the_model():
    steps = pipeline().steps
    steps[1] = StepWiring("encoder", {"tokens": "tokens", "mask": "tokens"}, {"embedding": "emb"})
    assert "steps/1/inputs/mask: model 'encoder' has no input 'mask' (inputs: tokens)" in problems(pipeline(steps=steps))


def test_step_output_missing_on_the_model():
    steps = pipeline().steps
    steps[1] = StepWiring("encoder", {"tokens": "tokens"}, {"pooled": "emb"})
    assert any(p.startswith("steps/1/outputs/pooled: model 'encoder' has no output 'pooled'")
               for p in problems(pipeline(steps=steps)))


def test_required_model_input_left_unmapped():
    steps = pipeline().steps
    steps[2] = StepWiring("post", {}, {"SCORE": "SCORE"})
    found = problems(pipeline(steps=steps))
    assert "steps/2/inputs: model 'post' needs input 'EMB', which the step does not map" in found


def test_tensor_produced_twice():
    steps = pipeline().steps + [StepWiring("post", {"EMB": "emb"}, {"SCORE": "SCORE"})]
    assert any("tensor 'SCORE' is produced twice (also by steps/2/outputs/SCORE)" in p
               for p in problems(pipeline(steps=steps)))


def test_tensor_never_produced():
    steps = pipeline().steps
    steps[2] = StepWiring("post", {"EMB": "embedding"}, {"SCORE": "SCORE"})
    found = problems(pipeline(steps=steps))
    assert any(p.startswith("steps/2/inputs/EMB: step input tensor 'embedding' is never produced") for p in found)


def test_tensor_never_consumed():
    steps = pipeline().steps
    steps[1] = StepWiring("encoder", {"tokens": "tokens"}, {"embedding": "emb"})
    steps.append(StepWiring("encoder", {"tokens": "tokens"}, {"embedding": "unused"}))
    assert any("step output tensor 'unused' is never consumed" in p for p in problems(pipeline(steps=steps)))


def test_ensemble_input_not_consumed_and_output_not_produced():
    found = problems(pipeline(inputs={"TEXT": TensorInfo("TYPE_STRING", (1,)), "EXTRA": FP32(1)},
                              outputs={"SCORE": FP32(1), "LABEL": INT64(1)}))
    assert "inputs/EXTRA: ensemble input tensor 'EXTRA' is never consumed by a step or an ensemble output" in found
    assert any(p.startswith("outputs/LABEL: ensemble output tensor 'LABEL' is never produced") for p in found)


def test_dtype_mismatch():
    found = problems(pipeline(outputs={"SCORE": INT64(1)}))
    assert "outputs/SCORE: tensor 'SCORE' is TYPE_FP32 at steps/2/outputs/SCORE but TYPE_INT64 here" in found


def test_shape_mismatch():
    found = problems(pipeline(outputs={"SCORE": FP32(2)}))
    assert "outputs/SCORE: tensor 'SCORE' has dims [1] at steps/2/outputs/SCORE but [2] here" in found


def test_cycle_is_reported_with_its_chain():
    loop = {"a": Interface("a", 8, {"IN": FP32(1), "BACK": FP32(1)}, {"OUT": FP32(1)}),
            "b": Interface("b", 8, {"IN": FP32(1)}, {"OUT": FP32(1), "BACK": FP32(1)})}
    ens = EnsembleWiring("ens", 8, {"X": FP32(1)}, {"Y": FP32(1)}, [
        StepWiring("a", {"IN": "X", "BACK": "back"}, {"OUT": "mid"}),
        StepWiring("b", {"IN": "mid"}, {"OUT": "Y", "BACK": "back"}),
    ])
    found = check_ensemble(ens, loop, lambda p: "/".join(map(str, p)))
    assert any("the steps form a cycle: a (step 0) -> b (step 1) -> a (step 0)" in p for p in found)


def test_ensemble_batch_larger_than_a_step_model():
    steps = pipeline().steps
    steps[2] = StepWiring("small", {"EMB": "emb"}, {"SCORE": "SCORE"})
    assert any("model 'small' has max_batch_size 2, below the ensemble's 8" in p
               for p in problems(pipeline(steps=steps)))


@pytest.mark.parametrize("a, b, agree", [((3, 4), (3, 4), True), ((-1,), (7,), True), ((3,), (3, 1), False),
                                         ((3, 4), (3, 5), False)])
def test_shapes_agree(a, b, agree):
    assert shapes_agree(a, b) is agree
