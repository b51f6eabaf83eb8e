"""The example streaming models as Triton model folders, built here from seeded weights:

- `write_stream_model(repo, name, kind)`: a `backend: "latte"` decoupled model whose version
  folder holds stream.json and its start and step graphs (docs/streaming.md): tokenize
  (Python) -> prefill (TorchScript) -> detokenize (Python) to start a stream; decode
  (TorchScript) -> detokenize (Python) for each next token;
- `write_stock_model(repo, name, kind)`: the same programs in a stock Python-backend decoupled
  model, a thread per request (stream_stock_model.py);
- `write_echo_model(repo, name)`: a stock decoupled model that only sends as many responses as
  it is asked for (the cost of the responses alone, for the bound), back to back or, asked for
  a `gap_ms`, one every gap_ms (the cadence of a stream in a batched loop).

`kind` is "gpt" (the transformer: its cache grows a row per token, in blocks) or "gru" (the
recurrent decoder: a fixed-size state). Both speak Triton's vLLM backend's interface:
text_input, stream, sampling_parameters -> text_output.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Dict, List, Optional

from latte.backend.streaming.controls import ADDITIONAL_OUTPUTS, CONTROL_TYPES

KINDS = ("gpt", "gru")
HERE = Path(__file__).resolve().parent
TEXT_STEPS = HERE / "stream_steps" / "text.py"
CONTEXT = 256          # the transformer's positions
BLOCK_TOKENS = 16


def _control(name: str) -> str:
    return f'{{ name: "{name}", data_type: {CONTROL_TYPES[name]}, dims: [ 1 ], optional: true }}'


_INPUTS = ['{ name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] }',
           *(_control(name) for name in ("stream", "sampling_parameters", "exclude_input_in_output"))]
_OUTPUT = '{ name: "text_output", data_type: TYPE_STRING, dims: [ -1 ] }'
_ADDITIONAL_INPUTS = [_control(flag) for flag in ADDITIONAL_OUTPUTS]
_ADDITIONAL_OUTPUTS = [f'{{ name: "{output}", data_type: {data_type}, dims: [ -1 ] }}'
                       for output, data_type in ADDITIONAL_OUTPUTS.values()]


def _io(inputs: List[str], outputs: List[str]) -> str:
    return "input [\n  " + ",\n  ".join(inputs) + "\n]\noutput [\n  " + ",\n  ".join(outputs) + "\n]\n"


VLLM_INPUTS = _io(_INPUTS, [_OUTPUT])
# The latte examples also offer two of the vLLM backend's additional outputs, each sent where
# its flag asks for it (docs/streaming.md).
VLLM_IO = _io(_INPUTS + _ADDITIONAL_INPUTS, [_OUTPUT, *_ADDITIONAL_OUTPUTS])


def _parameters(values: Dict[str, object]) -> str:
    return "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in values.items())


def _tensor(name: str, data_type: str, dims: List[int]) -> dict:
    return {"name": name, "data_type": data_type, "dims": dims}


def _programs(kind: str, seed: int):
    from latte.examples.stream_models import gpt_programs, gru_programs

    if kind == "gpt":
        prefill, decode, row = gpt_programs(seed, context=CONTEXT)
        return prefill, decode, row
    prefill, decode, hidden = gru_programs(seed)
    return prefill, decode, [hidden]


def _model_step(name: str, inputs: List[dict], outputs: List[dict]) -> dict:
    return {"name": name, "backend": "latte", "max_batch_size": 256, "input": inputs, "output": outputs}


def _function_step(name: str, inputs: List[dict], outputs: List[dict]) -> dict:
    return {"name": name, "backend": "python", "max_batch_size": 256, "input": inputs, "output": outputs}


def _graph(inputs: List[dict], outputs: List[dict], steps: List[dict], samples: Optional[list] = None) -> dict:
    graph = {"format": "latte-graph/1", "inputs": inputs, "outputs": outputs, "steps": steps, "branches": "inline"}
    if samples:
        graph["samples"] = samples
    return graph


def _stream_files(version: Path, kind: str, row: List[int]) -> None:
    """stream.json, start.json and step.json of the example `kind`."""
    text_in = _tensor("text", "TYPE_STRING", [1])
    ids, lengths = _tensor("ids", "TYPE_INT64", [-1]), _tensor("lengths", "TYPE_INT64", [1])
    token = _tensor("token", "TYPE_INT64", [1])
    text_out = _tensor("text_output", "TYPE_STRING", [1])
    tokenize = {"name": "tokenize", "folder": "steps/text", "function": "tokenize",
                "config": _function_step("tokenize", [text_in], [ids, lengths]),
                "inputs": {"text": "text_input"}, "outputs": {"ids": "ids", "lengths": "prompt_lengths"}}

    def detokenize(source: str) -> dict:
        return {"name": "detokenize", "folder": "steps/text", "function": "detokenize",
                "config": _function_step("detokenize", [token], [text_out]),
                "inputs": {"token": source}, "outputs": {"text_output": "text_output"}}

    if kind == "gpt":
        state_dims, state_name = [-1, *row], "kv"
        prefill_out = [token, _tensor("cache", "TYPE_FP32", state_dims)]
        decode_in = [token, _tensor("cache", "TYPE_FP32", state_dims), _tensor("cache_lengths", "TYPE_INT64", [1])]
        decode_out = [_tensor("next_token", "TYPE_INT64", [1]), _tensor("cache_row", "TYPE_FP32", row)]
        decode_map = {"inputs": {"token": "token", "cache": "kv", "cache_lengths": "kv_lengths"},
                      "outputs": {"next_token": "next_token", "cache_row": "kv_row"}}
        start_state = [_tensor("kv", "TYPE_FP32", state_dims)]
        step_in = [_tensor("token", "TYPE_INT64", [1]), _tensor("kv", "TYPE_FP32", state_dims),
                   _tensor("kv_lengths", "TYPE_INT64", [1])]
        step_out = [_tensor("next_token", "TYPE_INT64", [1]), _tensor("kv_row", "TYPE_FP32", row)]
        stream = {"state": {"token": "next_token"},
                  "cache": {"name": "kv", "lengths": "kv_lengths", "row": "kv_row", "block_tokens": BLOCK_TOKENS,
                            "max_tokens": CONTEXT}}
    else:
        state_name = "hidden"
        prefill_out = [token, _tensor("hidden", "TYPE_FP32", row)]
        decode_in = [token, _tensor("hidden", "TYPE_FP32", row)]
        decode_out = [_tensor("next_token", "TYPE_INT64", [1]), _tensor("next_hidden", "TYPE_FP32", row)]
        decode_map = {"inputs": {"token": "token", "hidden": "hidden"},
                      "outputs": {"next_token": "next_token", "next_hidden": "next_hidden"}}
        start_state = [_tensor("hidden", "TYPE_FP32", row)]
        step_in = [_tensor("token", "TYPE_INT64", [1]), _tensor("hidden", "TYPE_FP32", row)]
        step_out = [_tensor("next_token", "TYPE_INT64", [1]), _tensor("next_hidden", "TYPE_FP32", row)]
        stream = {"state": {"token": "next_token", "hidden": "next_hidden"}}
    prefill = {"name": "prefill", "folder": "steps/prefill",
               "config": _model_step("prefill", [ids, lengths], prefill_out),
               "inputs": {"ids": "ids", "lengths": "prompt_lengths"},
               "outputs": {"token": "token", prefill_out[1]["name"]: state_name}}
    decode = {"name": "decode", "folder": "steps/decode", "config": _model_step("decode", decode_in, decode_out),
              **decode_map}
    start = _graph([_tensor("text_input", "TYPE_STRING", [1])], [token, *start_state, text_out],
                   [tokenize, prefill, detokenize("token")], samples=[{"text_input": ["a first prompt"]},
                                                                     {"text_input": ["another"]}])
    step = _graph(step_in, [*step_out, text_out], [decode, detokenize("next_token")])
    (version / "start.json").write_text(json.dumps(start, indent=1))
    (version / "step.json").write_text(json.dumps(step, indent=1))
    (version / "stream.json").write_text(json.dumps({"format": "latte-stream/1", "start": "start.json",
                                                     "step": "step.json", **stream, "token": "token",
                                                     "end_tokens": [0]}, indent=1))


def write_stream_model(repo: Path, name: str, kind: str = "gpt", seed: int = 0, max_streams: int = 64,
                       joins_per_iteration: int = 8, max_tokens: int = 16, extra: Optional[Dict] = None) -> Path:
    """A latte streaming model of `kind` at repo/name."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    prefill, decode, row = _programs(kind, seed)
    folder = Path(repo) / name
    version = folder / "1"
    for step in ("text", "prefill", "decode"):
        (version / "steps" / step / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(TEXT_STEPS, version / "steps" / "text" / "1" / "model.py")
    prefill.save(str(version / "steps" / "prefill" / "1" / "model.pt"))
    decode.save(str(version / "steps" / "decode" / "1" / "model.pt"))
    _stream_files(version, kind, row)
    params = {"max_streams": max_streams, "joins_per_iteration": joins_per_iteration, "max_tokens": max_tokens,
              "intra_op_threads": 1, **(extra or {})}
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "latte"\nmax_batch_size: 0\n'
        "model_transaction_policy { decoupled: true }\n" + VLLM_IO
        + "instance_group [ { count: 1, kind: KIND_CPU } ]\n" + _parameters(params) + "\n")
    return folder


def write_stock_model(repo: Path, name: str, kind: str = "gpt", seed: int = 0, max_tokens: int = 16) -> Path:
    """The same programs in a stock Python-backend decoupled model at repo/name."""
    prefill, decode, _ = _programs(kind, seed)
    folder = Path(repo) / name
    version = folder / "1"
    version.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "stream_stock_model.py", version / "model.py")
    shutil.copy(TEXT_STEPS, version / "text.py")
    prefill.save(str(version / "prefill.pt"))
    decode.save(str(version / "decode.pt"))
    params = {"kind": kind, "context": CONTEXT, "max_tokens": max_tokens, "intra_op_threads": 1}
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        "model_transaction_policy { decoupled: true }\n" + VLLM_INPUTS
        + "instance_group [ { count: 1, kind: KIND_CPU } ]\n" + _parameters(params) + "\n")
    return folder


ECHO_MODEL = '''\
"""Sends as many one-character responses as sampling_parameters' max_tokens asks, and nothing
else: what streaming that many responses through the stub costs. With a gap_ms there, the
responses of a request leave one every gap_ms (on a schedule from its first, so a late one does
not push back the rest), as a stream's outputs leave a loop that steps every stream in turn."""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.piece = pb_utils.Tensor  # looked up once

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.echo, args=(request,), daemon=True).start()
        return None

    def echo(self, request):
        sender = request.get_response_sender()
        sampling = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
        keys = json.loads(sampling.as_numpy().reshape(-1)[0]) if sampling else {}
        count, gap = int(keys.get("max_tokens", 16)), float(keys.get("gap_ms", 0)) / 1000.0
        first = time.monotonic()
        for i in range(count):
            delay = first + i * gap - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            response = pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([b"x"], dtype=object))])
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == count - 1 else 0)
'''


def write_echo_model(repo: Path, name: str = "echo_stream") -> Path:
    folder = Path(repo) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.py").write_text(ECHO_MODEL)
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        "model_transaction_policy { decoupled: true }\n" + VLLM_INPUTS
        + "instance_group [ { count: 1, kind: KIND_CPU } ]\n")
    return folder


STREAM_SPEC = """\
# The streaming examples with their SLOs: `latte generate` profiles each against the number of
# live streams and derives max_streams and joins_per_iteration (docs/streaming.md).
models:
  - name: textgen
    stream: textgen/1/stream.json
    ttft_ms: 200            # P99 time to first token
    inter_token_ms: 40      # P99 time between tokens
    max_tokens: 32
  - name: textgen_gru
    stream: textgen_gru/1/stream.json
    ttft_ms: 100
    inter_token_ms: 25
    max_tokens: 32
"""


def write_stream_spec(repo: Path) -> Path:
    """repo/streams.yaml: a spec of the examples textgen and textgen_gru written in repo."""
    path = Path(repo) / "streams.yaml"
    path.write_text(STREAM_SPEC)
    return path


def generate_alone(folder: Path, prompt: bytes, max_tokens: int, ignore_eos: bool = False) -> bytes:
    """The text the example at `folder` (a latte streaming model) makes for `prompt` run alone,
    without Triton: its programs called one token at a time, as the stock model calls them."""
    import importlib.util

    import torch

    version = Path(folder) / "1"
    stream = json.loads((version / "stream.json").read_text())
    spec = importlib.util.spec_from_file_location("_latte_example_text", version / "steps" / "text" / "1" / "model.py")
    text = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(text)
    prefill = torch.jit.load(str(version / "steps" / "prefill" / "1" / "model.pt"))
    decode = torch.jit.load(str(version / "steps" / "decode" / "1" / "model.pt"))
    gpt = "cache" in stream
    ids = torch.from_numpy(text.encode(prompt))
    out = []
    with torch.inference_mode():
        token, state = prefill(ids[None], torch.tensor([[len(ids)]]))
        length = len(ids)
        while True:
            if int(token) == 0 and not ignore_eos:
                break
            out.append(text.decode(int(token)))
            if len(out) >= max_tokens or (gpt and length >= CONTEXT):
                break
            if gpt:
                room = torch.cat([state, torch.zeros_like(state[:, :1])], dim=1)
                token, row = decode(token, room, torch.tensor([[length]]))
                state = torch.cat([state, row[:, None]], dim=1)
                length += 1
            else:
                token, state = decode(token, state)
    return b"".join(out)
