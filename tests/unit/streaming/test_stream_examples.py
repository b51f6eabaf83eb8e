"""The example text generators served in process (the stub stood in for): every stream's text
equals the same model run alone, however streams join; bad prompts end only their own."""

import json
import time

import numpy as np
import pytest

from latte.backend.standin_stub import InferenceRequest, StandinStub
from latte.examples.streams import generate_alone, write_stream_model

PROMPTS = [b"hello world", b"The quick brown fox", b"a", b"streams join and leave", b"0123456789" * 5]


def served(kind, tmp_path, inputs=(), outputs=(), edit=lambda folder: None, prompt_optional=False, **parameters):
    """The example in process; `inputs` and `outputs`, (name, data type) pairs, join its config's;
    `edit` changes its files before it loads."""
    from latte.backend.streaming.model import StreamingModel

    folder = write_stream_model(tmp_path, f"textgen_{kind}", kind)
    edit(folder)
    config = {"name": f"textgen_{kind}", "backend": "latte", "max_batch_size": 0,
              "model_transaction_policy": {"decoupled": True},
              "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1], "optional": prompt_optional},
                        {"name": "stream", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
                        {"name": "sampling_parameters", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
                        *({"name": n, "data_type": t, "dims": [1], "optional": True} for n, t in inputs)],
              "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
                         *({"name": n, "data_type": t, "dims": [-1]} for n, t in outputs)],
              "parameters": {k: {"string_value": str(v)} for k, v in parameters.items()}}
    args = {"model_config": json.dumps(config), "model_repository": str(folder), "model_version": "1"}
    return StreamingModel(args, StandinStub), folder


def request(prompt, max_tokens, stream=True, ignore_eos=False, flags=()):
    sampling = {"max_tokens": max_tokens, **({"ignore_eos": True} if ignore_eos else {})}
    return InferenceRequest({"text_input": np.array([prompt], dtype=object), "stream": np.array([stream]),
                             "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=object),
                             **{flag: np.array([True]) for flag in flags}})


def wait_final(requests, timeout=60.0):
    ends = time.monotonic() + timeout
    while time.monotonic() < ends:
        if all(r.get_response_sender().sent and r.get_response_sender().sent[-1][1] for r in requests):
            return
        time.sleep(0.01)
    raise AssertionError("some streams got no final response")


def texts(request):
    sent = request.get_response_sender().sent
    pieces = [r.output_tensors()[0].as_numpy()[0] for r, _ in sent if r is not None and not r.has_error()]
    errors = [r.error().message() for r, _ in sent if r is not None and r.has_error()]
    return b"".join(pieces), errors, sum(1 for _, flags in sent if flags)


@pytest.mark.parametrize("kind", ["gpt", "gru"])
def test_every_stream_equals_its_model_run_alone_however_streams_join(kind, tmp_path):
    # min_batch_rows auto: a batch's kernels may round differently with its row count (the
    # recurrent example's do on some x86 processors), and batches are padded to the smallest
    # count whose rows do not depend on their neighbours, so alone means served alone.
    model, folder = served(kind, tmp_path, max_streams=4, joins_per_iteration=2, min_batch_rows="auto")
    try:
        first = [request(p, 6 + 9 * i) for i, p in enumerate(PROMPTS)]
        model.execute(first[:2])
        time.sleep(0.05)            # the first two are running when the others arrive
        model.execute(first[2:])
        wait_final(first)
        for i, (prompt, r) in enumerate(zip(PROMPTS, first)):
            text, errors, finals = texts(r)
            assert not errors and finals == 1
            alone = request(prompt, 6 + 9 * i)
            model.execute([alone])
            wait_final([alone])
            assert text == texts(alone)[0]
            if model.engine.min_rows == 1:  # batches of one row are the programs called one token at a time
                assert text == generate_alone(folder, prompt, 6 + 9 * i)
    finally:
        model.finalize()
    figures = model.figures()
    assert figures["live"] == 0 and figures["held_bytes"] == 0 and figures["finished"] == 2 * len(PROMPTS)  # each served together, then alone


def test_the_published_state_figures_are_the_loops_own_snapshot(tmp_path):
    model, _ = served("gpt", tmp_path, max_streams=4)
    try:
        calls = [request(p, 40) for p in PROMPTS[:3]]
        model.execute(calls)
        deadline = time.monotonic() + 10
        figures = model.figures()
        while figures["live"] < 3 and time.monotonic() < deadline:
            time.sleep(0.002)
            figures = model.figures()
        assert figures["live"] == 3 and 0 < figures["held_bytes"] == figures["needed_bytes"]
        wait_final(calls)
        # Idle, the loop takes no snapshot: what the model publishes is the runner's, as it is.
        model.runner.held = {**model.runner.held, "live": 7, "held_bytes": 4096, "needed_bytes": 2048}
        published = model.figures()
        assert (published["live"], published["held_bytes"], published["needed_bytes"]) == (7, 4096, 2048)
    finally:
        model.finalize()


def test_bad_prompts_end_only_their_own_stream_with_the_step_named(tmp_path):
    model, folder = served("gpt", tmp_path)
    try:
        calls = [request(b"", 5), request(b"x" * 300, 5), request(b"fine", 5), request(b"fine", 0)]
        model.execute(calls)
        wait_final(calls)
        assert texts(calls[0])[1] == ["step 'tokenize': the prompt is empty"]
        assert texts(calls[1])[1] == ["step 'tokenize': the prompt has 300 characters; at most 192 are read"]
        assert texts(calls[2])[0] == generate_alone(folder, b"fine", 5)
        assert texts(calls[3])[1] == ["'max_tokens' must be an integer >= 1, got 0"]
        error = calls[0].get_response_sender().sent[-1][0].error()
        assert error.code() == StandinStub.TritonError.INVALID_ARG
    finally:
        model.finalize()


def test_each_output_sent_is_timed_from_its_streams_arrival_or_its_previous_output(tmp_path):
    model, _ = served("gru", tmp_path)
    try:
        calls = [request(b"hello", 5, ignore_eos=True), request(b"world", 3, ignore_eos=True), request(b"", 5)]
        started = time.monotonic()
        model.execute(calls)
        wait_final(calls)
        took_us = (time.monotonic() - started) * 1e6
    finally:
        model.finalize()
    counters, _ = model.metrics.aggregate.snapshot()
    # Two streams sent 5 and 3 outputs; the one refused sent none.
    assert counters[("latte_stream_first_output_us_count", ())] == 2
    assert counters[("latte_stream_inter_output_us_count", ())] == 4 + 2
    assert 0 < counters[("latte_stream_first_output_us_sum", ())] <= 2 * took_us
    assert 0 < counters[("latte_stream_inter_output_us_sum", ())] <= 6 * took_us


def test_a_response_not_streamed_is_the_prompt_and_the_text(tmp_path):
    model, folder = served("gru", tmp_path)
    try:
        call = request(b"once upon", 12, stream=False)
        model.execute([call])
        wait_final([call])
        (response, flags), = call.get_response_sender().sent
        assert flags and response.output_tensors()[0].as_numpy().tolist() == [
            b"once upon" + generate_alone(folder, b"once upon", 12)]
    finally:
        model.finalize()


def test_a_stream_model_that_is_not_decoupled_is_refused_saying_how_to_fix_it(tmp_path):
    from latte.backend.errors import ConfigError
    from latte.backend.graph.graph import load_model
    from latte.backend.config import parse_model_config

    folder = write_stream_model(tmp_path, "plain", "gru")
    config = {"name": "plain", "backend": "latte", "max_batch_size": 0,
              "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
              "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}]}
    with pytest.raises(ConfigError, match=r"set model_transaction_policy \{ decoupled: true \}"):
        load_model(parse_model_config(config, folder, "1"))


@pytest.mark.parametrize("freeze, frozen", [("true", True), ("false", False)])
def test_the_models_freeze_parameter_reaches_the_steps_of_both_graphs(tmp_path, freeze, frozen):
    model, _ = served("gpt", tmp_path, freeze=freeze)
    try:
        torch_steps = [step for graph in (model.start_graph, model.step_graph) for step in graph.steps
                       if getattr(step, "runtime", None) is not None and step.runtime.kind == "torchscript"]
        assert len(torch_steps) == 2  # prefill and decode
        assert all((list(step.runtime.module.parameters()) == []) == frozen for step in torch_steps)
    finally:
        model.finalize()


def test_the_question_budget_is_a_parameter_and_a_bad_one_is_named(tmp_path):
    from latte.backend.errors import ConfigError

    model, _ = served("gru", tmp_path / "budget", cancel_checks_per_s=20)
    try:
        assert model.runner.cancel_checks_per_s == 20
    finally:
        model.finalize()
    named = r"model 'textgen_gru': parameters\['cancel_checks_per_s'\] must be >= 1, got 0"
    with pytest.raises(ConfigError, match=named):
        served("gru", tmp_path / "bad", cancel_checks_per_s=0)


def test_a_declared_finish_reason_comes_in_the_responses_of_the_streams_that_ask_for_it(tmp_path):
    model, _ = served("gru", tmp_path, inputs=[("return_finish_reason", "TYPE_BOOL")],
                      outputs=[("finish_reason", "TYPE_STRING")])
    try:
        asking = request(b"hello", 3, ignore_eos=True, flags=["return_finish_reason"])
        plain = request(b"hello", 3, ignore_eos=True)
        model.execute([asking, plain])
        wait_final([asking, plain])
        said = [{t.name(): t.as_numpy().tolist() for t in r.output_tensors()}
                for r, _ in asking.get_response_sender().sent]
        assert [s["finish_reason"] for s in said] == [[b"None"], [b"None"], [b"length"]]
        assert {t.name() for r, _ in plain.get_response_sender().sent for t in r.output_tensors()} == {"text_output"}
        assert texts(asking)[0] == texts(plain)[0]
    finally:
        model.finalize()


def test_a_flag_declared_without_its_output_stops_the_model_loading_saying_so(tmp_path):
    from latte.backend.errors import ConfigError

    with pytest.raises(ConfigError, match="model 'textgen_gru': the config declares input 'return_num_output_tokens' "
                                          "but not output 'num_output_tokens'"):
        served("gru", tmp_path, inputs=[("return_num_output_tokens", "TYPE_BOOL")])


def test_a_stream_ending_on_its_end_token_closes_with_the_empty_text_and_its_reason_not_counted_an_output(tmp_path):
    model, folder = served("gru", tmp_path, inputs=[("return_finish_reason", "TYPE_BOOL"),
                                                    ("return_num_output_tokens", "TYPE_BOOL")],
                           outputs=[("finish_reason", "TYPE_STRING"), ("num_output_tokens", "TYPE_UINT32")])
    try:
        text = generate_alone(folder, b"9", 64)
        assert len(text) < 64  # this prompt's text ends on the end token
        asking = request(b"9", 64, flags=["return_finish_reason", "return_num_output_tokens"])
        model.execute([asking])
        wait_final([asking])
        sent = asking.get_response_sender().sent
        said = [({t.name(): t.as_numpy().tolist() for t in r.output_tensors()}, flags) for r, flags in sent]
        assert [s["finish_reason"] for s, _ in said] == [[b"None"]] * len(text) + [[b"stop"]]
        assert [s["num_output_tokens"] for s, _ in said] == [[1]] * (len(text) + 1)
        assert said[-1][0]["text_output"] == [b""] and [bool(flags) for _, flags in said] == [False] * len(text) + [True]
        assert b"".join(s["text_output"][0] for s, _ in said) == text
        assert model.runner.figures["outputs"] == len(text)  # the closing response is no output of the model
    finally:
        model.finalize()
    counters, _ = model.metrics.aggregate.snapshot()  # nor is it timed as one
    assert counters[("latte_stream_first_output_us_count", ())] == 1
    assert counters[("latte_stream_inter_output_us_count", ())] == len(text) - 1


def test_graphs_writing_an_output_latte_makes_stop_the_model_loading_saying_so(tmp_path):
    from latte.backend.errors import ConfigError

    def rename_text(folder):  # the graphs' text output becomes finish_reason
        for graph in ("start.json", "step.json"):
            path = folder / "1" / graph
            path.write_text(path.read_text().replace('"text_output"', '"finish_reason"'))

    with pytest.raises(ConfigError, match="model 'textgen_gru': the graphs write 'finish_reason', which latte makes "
                                          "itself"):
        served("gru", tmp_path, inputs=[("return_finish_reason", "TYPE_BOOL")],
               outputs=[("finish_reason", "TYPE_STRING")], edit=rename_text)


def errors_and_codes(call):
    return [(r.error().message(), r.error().code()) for r, _ in call.get_response_sender().sent
            if r is not None and r.has_error()]


def test_a_control_python_cannot_read_as_a_number_is_a_bad_request_and_the_call_goes_on(tmp_path):
    model, folder = served("gru", tmp_path)
    try:
        odd = InferenceRequest({"text_input": np.array([b"hello"], dtype=object),
                                "sampling_parameters": np.array([b'{"max_tokens": "\\u00b2"}'], dtype=object)})
        calls = [request(b"fine", 3), odd, request(b"also fine", 2)]
        model.execute(calls)
        wait_final(calls)
        assert errors_and_codes(odd) == [("'max_tokens' must be an integer >= 1, got '\u00b2'",
                                          StandinStub.TritonError.INVALID_ARG)]
        assert texts(calls[0])[0] == generate_alone(folder, b"fine", 3)
        assert texts(calls[2])[0] == generate_alone(folder, b"also fine", 2)
        assert [texts(call)[2] for call in calls] == [1, 1, 1]  # one final each
    finally:
        model.finalize()


def test_a_failure_of_the_loop_itself_ends_its_streams_and_the_next_ones_are_served(tmp_path):
    model, folder = served("gru", tmp_path)
    engine = model.runner.engine
    real = engine.step
    failing = [True]

    def step_once_broken(streams):
        if failing[0]:
            failing[0] = False
            raise KeyError("a defect")
        return real(streams)

    engine.step = step_once_broken
    try:
        first = [request(b"hello", 5, ignore_eos=True), request(b"world", 5, ignore_eos=True)]
        model.execute(first)
        wait_final(first)
        for call in first:
            (error,) = errors_and_codes(call)
            assert error == ("model 'textgen_gru': the iteration loop failed: KeyError: 'a defect'",
                             StandinStub.TritonError.INTERNAL)
            assert texts(call)[2] == 1
        assert model.runner.engine.held()["state_slots"] == 0
        assert any(level == "error" and "the iteration loop failed: KeyError" in line
                   for level, line in StandinStub.Logger.lines)
        later = request(b"hello", 4, ignore_eos=True)
        model.execute([later])
        wait_final([later])
        assert texts(later) == (generate_alone(folder, b"hello", 4, ignore_eos=True), [], 1)
    finally:
        model.finalize()


def test_an_output_triton_cannot_carry_ends_its_stream_there_with_that_error(tmp_path):
    model, _ = served("gru", tmp_path)
    real = model.responses.success
    made = []

    def refusing(outputs):  # the stub's Tensor refuses the stream's third output
        made.append(outputs)
        if len(made) == 3:
            raise TypeError("the output holds an object Triton cannot serialize")
        return real(outputs)

    model.responses.success = refusing
    call = request(b"hello", 8, ignore_eos=True)
    try:
        model.execute([call])
        wait_final([call])
        sent = call.get_response_sender().sent
        assert [r.has_error() for r, _ in sent] == [False, False, True]
        assert [bool(flags) for _, flags in sent] == [False, False, True]
        (error,) = errors_and_codes(call)
        assert error == ("model 'textgen_gru': could not make a response of its output: TypeError: the output "
                         "holds an object Triton cannot serialize", StandinStub.TritonError.INTERNAL)
        assert model.runner.engine.held()["state_slots"] == 0
    finally:
        model.finalize()


def test_a_request_without_an_optional_input_the_start_reads_is_told_which(tmp_path):
    model, _ = served("gru", tmp_path, prompt_optional=True)
    try:
        bare = InferenceRequest({"sampling_parameters": np.array([b'{"max_tokens": 2}'], dtype=object)})
        fine = request(b"hello", 2)
        model.execute([bare, fine])
        wait_final([bare, fine])
        assert errors_and_codes(bare) == [("start.json reads input 'text_input', which the request does not carry",
                                           StandinStub.TritonError.INVALID_ARG)]
        assert texts(fine)[1:] == ([], 1)
    finally:
        model.finalize()
