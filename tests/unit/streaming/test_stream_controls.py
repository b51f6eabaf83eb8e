"""A streaming request's controls, read as Triton's vLLM backend reads them."""

import json

import numpy as np
import pytest

from latte.backend.errors import RequestError
from latte.backend.streaming.controls import read_controls
from latte.backend.streaming.streams import Stream


def sampling(**keys):
    return np.array([json.dumps(keys).encode()], dtype=object)


def test_a_model_declaring_stream_streams_only_when_asked_and_then_prepends_nothing():
    quiet = read_controls({}, {}, 16, declares_stream=True)
    assert (quiet.stream, quiet.prepend_input, quiet.max_tokens) == (False, True, 16)
    asked = read_controls({"stream": np.array([True])}, {}, 16, declares_stream=True)
    assert (asked.stream, asked.prepend_input) == (True, False)
    assert read_controls({}, {}, 16, declares_stream=False).stream


def test_sampling_parameters_come_from_the_input_or_the_request_parameters():
    from_input = read_controls({"sampling_parameters": sampling(max_tokens=5, stop=["\n", "END"], ignore_eos=True,
                                                                 temperature=0.7)}, {}, 16, True)
    assert (from_input.max_tokens, from_input.stop, from_input.ignore_eos) == (5, (b"\n", b"END"), True)
    from_parameters = read_controls({}, {"max_tokens": "7", "stop": "x", "priority_level": 2}, 16, True)
    assert (from_parameters.max_tokens, from_parameters.stop, from_parameters.options.priority) == (7, (b"x",), 2)


@pytest.mark.parametrize("keys, wording", [
    ({"max_tokens": 0}, "'max_tokens' must be an integer >= 1, got 0"),
    ({"max_tokens": "many"}, "'max_tokens' must be an integer >= 1, got 'many'"),
    # str.isdigit() says yes to a superscript two, which int() refuses
    ({"max_tokens": "\u00b2"}, "'max_tokens' must be an integer >= 1, got '\u00b2'"),
    ({"stop": [""]}, "'stop' must be a string or a list of strings (none empty)"),
    ({"ignore_eos": "maybe"}, "'ignore_eos' must be a boolean, got 'maybe'"),
])
def test_bad_sampling_parameters_are_refused_saying_what_is_wrong(keys, wording):
    with pytest.raises(RequestError) as refused:
        read_controls({"sampling_parameters": sampling(**keys)}, {}, 16, True)
    assert wording in str(refused.value)


def test_streaming_with_the_prompt_prepended_is_refused_as_vllm_refuses_it():
    with pytest.raises(RequestError, match="when streaming, exclude_input_in_output=false is not allowed"):
        read_controls({"stream": np.array([True]), "exclude_input_in_output": np.array([False])}, {}, 16, True)


def test_sampling_parameters_that_are_not_json_are_refused():
    with pytest.raises(RequestError, match="input 'sampling_parameters' must be a JSON object"):
        read_controls({"sampling_parameters": np.array([b"{max_tokens"], dtype=object)}, {}, 16, True)


def text(piece: bytes):
    return {"text_output": np.array([piece], dtype=object)}


def test_a_stop_string_ends_the_text_before_it_even_across_outputs():
    controls = read_controls({"sampling_parameters": sampling(stop=["lo w"], max_tokens=50)}, {}, 16, False)
    stream = Stream({}, controls, 0.0, text="text_output")
    sent = [stream.take(text(piece)) for piece in (b"hel", b"lo", b" wor")]
    assert [bytes(outcome["text_output"][0]) for outcome, _ in sent] == [b"hel", b"lo", b""]
    assert [final for _, final in sent] == [False, False, True]


def test_a_response_not_streamed_is_the_prompt_and_every_output_joined():
    controls = read_controls({}, {"max_tokens": 3}, 16, True)
    stream = Stream({}, controls, 0.0, text="text_output", prompt=b"Q: ")
    assert stream.take(text(b"a")) is None
    assert stream.take(text(b"b")) is None
    outcome, final = stream.take(text(b"c"))
    assert final and outcome["text_output"].tolist() == [b"Q: abc"]


# -- the vLLM backend's additional outputs -----------------------------------------------------
def asking(*flags, **keys):
    inputs = {flag: np.array([True]) for flag in flags}
    inputs["stream"] = np.array([True])
    if keys:
        inputs["sampling_parameters"] = sampling(**keys)
    return read_controls(inputs, {}, 16, declares_stream=True)


def finish(outcome):
    return bytes(outcome["finish_reason"][0]).decode()


def test_each_response_says_why_the_stream_ended_once_it_has_and_how_many_tokens_it_adds():
    controls = asking("return_finish_reason", "return_num_output_tokens", max_tokens=3)
    assert controls.additional == ("finish_reason", "num_output_tokens")
    stream = Stream({}, controls, 0.0, text="text_output")
    sent = [stream.take(text(piece)) for piece in (b"a", b"b", b"c")]
    assert [(finish(outcome), int(outcome["num_output_tokens"][0]), final) for outcome, final in sent] == [
        ("None", 1, False), ("None", 1, False), ("length", 1, True)]
    assert [outcome["num_output_tokens"].dtype for outcome, _ in sent] == [np.uint32] * 3
    assert bytes(sent[2][0]["text_output"][0]) == b"c"


def test_the_end_token_ends_with_a_response_of_the_empty_text_where_the_reason_was_asked_for():
    stream = Stream({}, asking("return_finish_reason", "return_num_output_tokens"), 0.0, text="text_output")
    stream.take(text(b"a"))
    assert stream.take(None) == (None, True)  # no output of the model: the sender sends what it closes with
    closing = stream.closing()
    # vLLM counts the end token among the tokens it made
    assert (finish(closing), closing["num_output_tokens"].tolist(), closing["text_output"].tolist()) == (
        "stop", [1], [b""])
    assert Stream({}, asking(), 0.0, text="text_output").closing() is None  # asked for nothing: the final flag alone


@pytest.mark.parametrize("ended_by, keys, reason", [
    ("stop", {"max_tokens": 1}, "stop"),        # the model's own end comes before max_tokens, as in vLLM
    ("length", {}, "length"),                   # the context is full
    (None, {"stop": ["x"]}, "stop"),            # a stop string
])
def test_the_finish_reason_is_a_stop_before_a_length(ended_by, keys, reason):
    stream = Stream({}, asking("return_finish_reason", **keys), 0.0, text="text_output")
    outcome, final = stream.take(text(b"x"), ended_by)
    assert final and finish(outcome) == reason and "num_output_tokens" not in outcome


def test_a_response_not_streamed_carries_the_reason_and_every_token():
    controls = read_controls({"return_finish_reason": np.array([True]), "return_num_output_tokens": np.array([True])},
                             {"max_tokens": 5}, 16, declares_stream=True)
    stream = Stream({}, controls, 0.0, text="text_output", prompt=b"Q: ")
    assert stream.take(text(b"a")) is None and stream.take(text(b"b")) is None
    outcome, final = stream.take(None)
    assert final and outcome["text_output"].tolist() == [b"Q: ab"]
    assert (finish(outcome), int(outcome["num_output_tokens"][0])) == ("stop", 3)  # a, b and the end token
    first = Stream({}, controls, 0.0, text="text_output", prompt=b"Q: ")
    outcome, final = first.take(None)  # the end token first: the prompt alone, and that one token
    assert final and outcome["text_output"].tolist() == [b"Q: "]
    assert (finish(outcome), int(outcome["num_output_tokens"][0])) == ("stop", 1)


@pytest.mark.parametrize("inputs, outputs, wording", [
    ({"return_finish_reason": "TYPE_BOOL"}, {}, "the config declares input 'return_finish_reason' but not output "
                                                "'finish_reason'"),
    ({}, {"num_output_tokens": "TYPE_UINT32"}, "the config declares output 'num_output_tokens' but not input "
                                               "'return_num_output_tokens'"),
    ({"return_finish_reason": "TYPE_STRING"}, {"finish_reason": "TYPE_STRING"},
     "input 'return_finish_reason' must be TYPE_BOOL, got TYPE_STRING"),
    ({"return_num_output_tokens": "TYPE_BOOL"}, {"num_output_tokens": "TYPE_INT64"},
     "output 'num_output_tokens' must be TYPE_UINT32, as the vLLM backend's, got TYPE_INT64"),
])
def test_an_additional_output_is_offered_whole_or_the_model_does_not_load(inputs, outputs, wording):
    from latte.backend.errors import ConfigError
    from latte.backend.streaming.controls import check_additional_outputs

    with pytest.raises(ConfigError) as refused:
        check_additional_outputs("textgen", inputs, outputs)
    assert f"model 'textgen': {wording}" in str(refused.value)
    check_additional_outputs("textgen", {"return_finish_reason": "TYPE_BOOL"}, {"finish_reason": "TYPE_STRING"})
