"""What a streaming request asks for besides its inputs, read as Triton's vLLM backend reads
it, so that its clients work unchanged:

    stream                   input, BOOL: each output as it is made (else one response at the end)
    exclude_input_in_output  input, BOOL: without it, a response that is not streamed starts with the prompt
    sampling_parameters      input, a JSON string; or the same keys as request parameters:
        max_tokens   outputs at most (the config's max_tokens by default)
        stop         a string or a list of strings that end the text (not sent)
        ignore_eos   true: the end token does not end the stream
    priority_level, timeout_ms   request parameters, as for every latte model (options.py)
    return_finish_reason     input, BOOL: each response carries `finish_reason` ("None" until the
                             last: "stop" for the end token, a stop string or the model's own
                             end; "length" for max_tokens or a full context)
    return_num_output_tokens input, BOOL: each response carries `num_output_tokens`, the tokens
                             it adds (UINT32)
    (the vLLM backend's additional outputs; a model offers one by declaring both the input and
    the output, check_additional_outputs)

Decoding is greedy: sampling keys (temperature, top_p, seed, ...) are read and have no effect.
Each of these is free of the stub's API, so it is tested without Triton.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Tuple

import numpy as np

from latte.backend.errors import ConfigError, RequestError
from latte.backend.options import DEFAULT_OPTIONS, RequestOptions, read_options

# The request's flag -> the output it asks for, with the output's Triton type.
ADDITIONAL_OUTPUTS = {"return_finish_reason": ("finish_reason", "TYPE_STRING"),
                      "return_num_output_tokens": ("num_output_tokens", "TYPE_UINT32")}
STREAM_OUTPUTS = frozenset(output for output, _ in ADDITIONAL_OUTPUTS.values())  # made by latte, not the graphs
# The vLLM backend's control inputs, each optional, with its Triton type.
CONTROL_TYPES = {"stream": "TYPE_BOOL", "exclude_input_in_output": "TYPE_BOOL", "sampling_parameters": "TYPE_STRING",
                 **{flag: "TYPE_BOOL" for flag in ADDITIONAL_OUTPUTS}}
CONTROL_INPUTS = tuple(CONTROL_TYPES)
_LIMITS = {"max_tokens": "an integer >= 1", "stop": "a string or a list of strings", "ignore_eos": "a boolean"}


@dataclass(frozen=True)
class StreamControls:
    stream: bool = True
    prepend_input: bool = False
    max_tokens: int = 16
    stop: Tuple[bytes, ...] = ()
    ignore_eos: bool = False
    options: RequestOptions = DEFAULT_OPTIONS
    additional: Tuple[str, ...] = ()   # the additional outputs asked for, by output name


def _flag(inputs: Mapping[str, np.ndarray], name: str) -> Optional[bool]:
    array = inputs.get(name)
    if array is None:
        return None
    if array.size != 1:
        raise RequestError(f"input {name!r} holds one boolean, got shape {list(array.shape)}")
    return bool(array.reshape(-1)[0])


def _sampling(inputs: Mapping[str, np.ndarray], parameters: Mapping[str, object]) -> Mapping[str, object]:
    array = inputs.get("sampling_parameters")
    if array is None:
        return parameters
    raw = array.reshape(-1)[0] if array.size else b""
    try:
        parsed = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"input 'sampling_parameters' must be a JSON object: {exc}") from None
    if not isinstance(parsed, dict):
        raise RequestError("input 'sampling_parameters' must be a JSON object")
    return {**parameters, **parsed}


def _max_tokens(value, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            pass  # refused below, in the request's own words
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"'max_tokens' must be {_LIMITS['max_tokens']}, got {value!r}")
    return value


def _stop(value) -> Tuple[bytes, ...]:
    if value is None:
        return ()
    if isinstance(value, str) and value.startswith("["):  # a list sent as a request parameter's string
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise RequestError(f"'stop' must be {_LIMITS['stop']} (none empty), got {value!r}")
    return tuple(s.encode() for s in value)


def _bool(value, key: str) -> bool:
    if value is None:
        return False
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise RequestError(f"'{key}' must be {_LIMITS[key]}, got {value!r}")
    return value


def read_controls(inputs: Mapping[str, np.ndarray], parameters: Mapping[str, object], default_max_tokens: int,
                  declares_stream: bool, timeout_us: int = 0) -> StreamControls:
    """A request's controls; RequestError names what is wrong. A model whose config declares
    no `stream` input streams every output; one that does streams when the request says so."""
    stream = _flag(inputs, "stream")
    stream = (not declares_stream) if stream is None else stream
    exclude = _flag(inputs, "exclude_input_in_output")
    prepend = (not exclude) if exclude is not None else not stream
    if prepend and stream:
        raise RequestError("when streaming, exclude_input_in_output=false is not allowed")
    sampling = _sampling(inputs, parameters)
    options = read_options({k: v for k, v in parameters.items() if k in ("priority_level", "timeout_ms")},
                           triton_timeout_us=timeout_us)
    additional = tuple(output for flag, (output, _) in ADDITIONAL_OUTPUTS.items() if _flag(inputs, flag))
    return StreamControls(stream=stream, prepend_input=prepend,
                          max_tokens=_max_tokens(sampling.get("max_tokens"), default_max_tokens),
                          stop=_stop(sampling.get("stop")), ignore_eos=_bool(sampling.get("ignore_eos"), "ignore_eos"),
                          options=options, additional=additional)


def check_additional_outputs(model: str, inputs: Mapping[str, str], outputs: Mapping[str, str]) -> None:
    """A model config offers an additional output by declaring its flag (an optional BOOL input)
    and the output, of the vLLM backend's types (name -> Triton data type); ConfigError says
    which half is missing or mistyped."""
    for flag, (output, data_type) in ADDITIONAL_OUTPUTS.items():
        if (flag in inputs) != (output in outputs):
            have, lacks = (f"input {flag!r}", f"output {output!r}") if flag in inputs else \
                (f"output {output!r}", f"input {flag!r}")
            raise ConfigError(f"model {model!r}: the config declares {have} but not {lacks}: a request asks for "
                              f"{output!r} with {flag!r}, so declare both or neither")
        if flag in inputs and inputs[flag] != CONTROL_TYPES[flag]:
            raise ConfigError(f"model {model!r}: input {flag!r} must be {CONTROL_TYPES[flag]}, got {inputs[flag]}")
        if output in outputs and outputs[output] != data_type:
            raise ConfigError(f"model {model!r}: output {output!r} must be {data_type}, as the vLLM backend's, "
                              f"got {outputs[output]}")


def check_not_written(model: str, written: Iterable[str]) -> None:
    """The graphs must not write an output latte makes itself: the one would hide the other.
    ConfigError names it."""
    clash = sorted(STREAM_OUTPUTS.intersection(written))
    if clash:
        raise ConfigError(f"model {model!r}: the graphs write {', '.join(repr(name) for name in clash)}, which latte "
                          "makes itself as the vLLM backend's additional output (docs/streaming.md); give the "
                          "graphs' output another name")
