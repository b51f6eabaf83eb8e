"""The unit tests' counting stream (tests/unit/streaming/counting_stream.py) as a served
`backend: "latte"` decoupled model, and a gRPC client that runs streams of it concurrently.

The model, as there: a request's `x` starts a stream whose outputs `y` count up from x, one a
step; `total` is the sum of the stream's cache rows so far (x rows of x, then one row per token
since), read back through the cache's blocks. The step fails on token 13 ("unlucky thirteen").
Served here, each step of the loop also sleeps STEP_S, so that streams sent one after another
run side by side whatever else the machine runs."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import numpy as np

COUNTING = Path(__file__).resolve().parents[1] / "unit" / "streaming" / "counting_stream.py"
# Each step of the loop: a stream of n outputs lasts at least n x STEP_S.
STEP_S = 0.05


def _counting_module():
    spec = importlib.util.spec_from_file_location("counting_stream", COUNTING)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_counting_model(repo: Path, name: str, max_tokens: int, **parameters) -> Path:
    """The counting stream at repo/name, each stream at most `max_tokens` outputs unless a request
    asks for fewer; `parameters` join the config's (cache_blocks, max_streams, ...)."""
    counting = _counting_module()
    folder = Path(repo) / name
    counting.write_counting_stream(folder, block_tokens=4, max_tokens=64)
    steps = folder / "1" / "steps" / "count" / "1" / "model.py"
    slowed = counting.STEPS.replace("def step(token, cache, lengths):\n",
                                    f"def step(token, cache, lengths):\n    time.sleep({STEP_S})\n", 1)
    steps.write_text("import time\n" + slowed)
    values = {"max_streams": 8, "joins_per_iteration": 8, "max_tokens": max_tokens, "intra_op_threads": 1,
              **parameters}
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "latte"\nmax_batch_size: 0\n'
        "model_transaction_policy { decoupled: true }\n"
        'input [ { name: "x" data_type: TYPE_INT64 dims: [ 1 ] },\n'
        '        { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true } ]\n'
        'output [ { name: "y" data_type: TYPE_INT64 dims: [ -1 ] },\n'
        '         { name: "total" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
        + "\n".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in values.items())
        + "\n")
    return folder


def expected_ys(x: int, outputs: int) -> List[int]:
    return list(range(x, x + outputs))


def expected_totals(x: int, outputs: int) -> List[float]:
    """The start's total is 0; each step's, the x rows of x and the rows of the tokens since."""
    return [0.0] + [float(x * x + sum(x + j for j in range(1, k))) for k in range(1, outputs)]


@dataclass
class Counted:
    """One stream as its client saw it."""
    x: int
    ys: List[int] = field(default_factory=list)
    totals: List[float] = field(default_factory=list)
    error: Optional[str] = None
    ended: bool = False                     # its final response or its error came
    ended_at: Optional[float] = None        # when (time.perf_counter())
    first_output: threading.Event = field(default_factory=threading.Event, repr=False)


class CountingStream:
    """One stream on a gRPC stream of its own (tritonclient's callback API), run in the
    background: `start()`, then `wait()` for its end."""

    def __init__(self, url: str, model: str, x: int, max_tokens: Optional[int] = None):
        import tritonclient.grpc as grpcclient

        self.record = Counted(x)
        self._done = threading.Event()
        self._client = grpcclient.InferenceServerClient(url)
        self._model = model
        self._inputs = [grpcclient.InferInput("x", [1], "INT64")]
        self._inputs[0].set_data_from_numpy(np.array([x], dtype=np.int64))
        if max_tokens is not None:
            sampling = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
            sampling.set_data_from_numpy(np.array([json.dumps({"max_tokens": max_tokens}).encode()], dtype=object))
            self._inputs.append(sampling)

    def _on_response(self, result, error) -> None:
        record = self.record
        if error is not None:
            record.error = str(error)
            self._end()
            return
        y, total = result.as_numpy("y"), result.as_numpy("total")
        if y is not None:
            record.ys.append(int(y.reshape(-1)[0]))
            record.totals.append(float(total.reshape(-1)[0]))
            record.first_output.set()
        parameters = result.get_response().parameters
        if "triton_final_response" in parameters and parameters["triton_final_response"].bool_param:
            self._end()

    def _end(self) -> None:
        if not self.record.ended:  # an error response may come before the final one
            self.record.ended, self.record.ended_at = True, time.perf_counter()
        self._done.set()

    def start(self) -> "CountingStream":
        self._client.start_stream(callback=self._on_response)
        self._client.async_stream_infer(self._model, self._inputs, request_id=str(self.record.x),
                                        enable_empty_final_response=True)
        return self

    def wait(self, timeout: float = 60.0) -> Counted:
        """Its record once it ended (or `timeout` passed); the gRPC stream is then closed, after
        the server ended the request, so it keeps no model from unloading."""
        self._done.wait(timeout)
        self._client.stop_stream()
        self._client.close()
        return self.record


def run_counting(url: str, model: str, x: int, max_tokens: Optional[int] = None) -> Counted:
    """One stream from start to end."""
    return CountingStream(url, model, x, max_tokens).start().wait()


def wait_all(streams: List[CountingStream], timeout: float = 60.0) -> List[Counted]:
    ends = time.monotonic() + timeout
    return [s.wait(max(0.0, ends - time.monotonic())) for s in streams]
