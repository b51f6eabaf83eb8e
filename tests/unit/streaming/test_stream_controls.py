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
    sent = [stream.take(text(piece), last=False) for piece in (b"hel", b"lo", b" wor")]
    assert [bytes(outcome["text_output"][0]) for outcome, _ in sent] == [b"hel", b"lo", b""]
    assert [final for _, final in sent] == [False, False, True]


def test_a_response_not_streamed_is_the_prompt_and_every_output_joined():
    controls = read_controls({}, {"max_tokens": 3}, 16, True)
    stream = Stream({}, controls, 0.0, text="text_output", prompt=b"Q: ")
    assert stream.take(text(b"a"), last=False) is None
    assert stream.take(text(b"b"), last=False) is None
    outcome, final = stream.take(text(b"c"), last=False)
    assert final and outcome["text_output"].tolist() == [b"Q: abc"]
