"""A streaming client over gRPC (tritonclient's asyncio API): streams that send a prompt and
take every response of a decoupled model, timed as each arrives. Shared by the tests, the
benchmark and `latte bench` for streams.

Each concurrent client is one bidirectional gRPC stream that sends its next request when the
last one's final response is in, as a chat client does.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

import numpy as np

# How long a client waits for the server to end its stream before it closes the channel.
STREAM_END_S = 5.0


@dataclass
class StreamRecord:
    """One request's stream as the client saw it."""
    prompt: bytes
    sent: float
    arrivals: List[float] = field(default_factory=list)   # one per response carrying an output
    pieces: List[bytes] = field(default_factory=list)
    error: Optional[str] = None
    cancelled: bool = False

    @property
    def text(self) -> bytes:
        return b"".join(self.pieces)

    @property
    def ttft(self) -> Optional[float]:
        return self.arrivals[0] - self.sent if self.arrivals else None

    def inter_token(self) -> List[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]


def request_inputs(prompt: bytes, stream: bool = True, **sampling) -> list:
    import tritonclient.grpc as grpcclient

    tensors = []
    for name, array, kind in (("text_input", np.array([prompt], dtype=object), "BYTES"),
                              ("stream", np.array([stream]), "BOOL"),
                              ("sampling_parameters", np.array([json.dumps(sampling).encode()], dtype=object),
                               "BYTES")):
        tensor = grpcclient.InferInput(name, [1], kind)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def _final(result) -> bool:
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and parameters["triton_final_response"].bool_param


def _piece(result) -> Optional[bytes]:
    array = result.as_numpy("text_output")
    if array is None:
        return None
    value = array.reshape(-1)[0]
    return value if isinstance(value, bytes) else str(value).encode()


async def _client(url: str, model: str, prompts: Iterable[bytes], sampling: Dict, stream: bool,
                  records: List[StreamRecord], until: float, cancel_after: Optional[int] = None,
                  parameters: Optional[Dict] = None) -> None:
    """One client: its prompts one after another on one gRPC stream; with `cancel_after`, each
    request is cancelled once that many outputs are in (the stream is cancelled, as a client that
    goes away cancels it, and the next request opens a new one)."""
    import tritonclient.grpc.aio as aioclient

    client = aioclient.InferenceServerClient(url)
    outgoing: Optional[asyncio.Queue] = None
    responses = None

    async def requests(queue: asyncio.Queue):
        while True:
            item = await queue.get()
            if item is None:
                return
            yield item

    try:
        for number, prompt in enumerate(prompts):
            if time.perf_counter() >= until:
                break
            if responses is None:
                outgoing = asyncio.Queue()
                responses = client.stream_infer(requests(outgoing))
            record = StreamRecord(prompt, time.perf_counter())
            records.append(record)
            await outgoing.put({"model_name": model, "inputs": request_inputs(prompt, stream, **sampling),
                                "request_id": str(number), "enable_empty_final_response": True,
                                "parameters": parameters or {}})
            answered = False  # the request's final response, its error or its cancellation came
            async for result, error in responses:
                now = time.perf_counter()
                if error is not None:
                    record.error, answered = str(error), True
                    break
                if result.get_response().id != str(number):
                    # An earlier request's, sent after the error it was recorded with (an error
                    # response need not be the final one): not this request's.
                    continue
                piece = _piece(result)
                if piece is not None:
                    record.arrivals.append(now)
                    record.pieces.append(piece)
                if _final(result):
                    answered = True
                    break
                if cancel_after is not None and len(record.pieces) >= cancel_after:
                    record.cancelled = answered = True
                    responses.cancel()
                    await outgoing.put(None)
                    responses = None
                    break
            if not answered:  # the server ended the stream first: the next request opens another
                record.error = "the stream ended before the request's final response"
                await outgoing.put(None)
                responses = None
    finally:
        if outgoing is not None:
            await outgoing.put(None)
        if responses is not None:
            # The server ends the stream once it has read the end of the requests; a channel
            # closed before that can keep the model from unloading in tritonserver 2.51 (its
            # stop then waits out the exit timeout, 30 s): so the client waits for the end.
            try:
                await asyncio.wait_for(_drain(responses), STREAM_END_S)
            except Exception:  # the stream failed or never ended: the channel closes anyway
                pass
        await client.close()


async def _drain(responses) -> None:
    async for _ in responses:
        pass


async def _streams(url: str, model: str, prompts: List[bytes], concurrency: int, sampling: Dict, stream: bool,
                   duration_s: Optional[float], per_client: Optional[int], cancel_after, parameters) -> List[StreamRecord]:
    records: List[StreamRecord] = []
    until = time.perf_counter() + duration_s if duration_s else float("inf")

    def prompts_of(client: int):
        count = 0
        while per_client is None or count < per_client:
            yield prompts[(client + count * concurrency) % len(prompts)]
            count += 1

    await asyncio.gather(*(_client(url, model, prompts_of(c), sampling, stream, records, until,
                                   cancel_after(c) if callable(cancel_after) else cancel_after, parameters)
                           for c in range(concurrency)))
    return records


def run_streams(url: str, model: str, prompts: List[bytes], concurrency: int = 1, max_tokens: int = 16,
                stream: bool = True, duration_s: Optional[float] = None, per_client: Optional[int] = None,
                cancel_after=None, parameters: Optional[Dict] = None, **sampling) -> List[StreamRecord]:
    """`concurrency` clients, each sending prompts one after another (per_client each, or until
    duration_s has passed); every stream's record."""
    if duration_s is None and per_client is None:
        per_client = 1
    return asyncio.run(_streams(url, model, prompts, concurrency, {"max_tokens": max_tokens, **sampling}, stream,
                                duration_s, per_client, cancel_after, parameters))


def generate(url: str, model: str, prompt: bytes, **kwargs) -> StreamRecord:
    """One prompt's stream (run_streams' options)."""
    return run_streams(url, model, [prompt], **kwargs)[0]


def http_stream(http_url: str, model: str, prompt: bytes, max_tokens: int, cancel_after: Optional[int] = None,
                timeout: float = 60.0, **sampling) -> StreamRecord:
    """One prompt through Triton's HTTP generate_stream endpoint (server-sent events); with
    `cancel_after`, the connection is closed once that many outputs are in, as a client that
    goes away closes it."""
    import http.client

    host, _, port = http_url.rpartition(":")
    body = json.dumps({"text_input": prompt.decode(errors="replace"), "stream": True, "max_tokens": max_tokens,
                       **sampling})
    record = StreamRecord(prompt, time.perf_counter())
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request("POST", f"/v2/models/{model}/generate_stream", body=body,
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            record.error = response.read().decode(errors="replace")
            return record
        while True:
            line = response.readline()  # the body's lines, chunked encoding undone; b"" at its end
            if not line:
                break
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                record.error = str(event["error"])
                break
            record.arrivals.append(time.perf_counter())
            record.pieces.append(str(event.get("text_output", "")).encode())
            if cancel_after is not None and len(record.pieces) >= cancel_after:
                record.cancelled = True
                break
    finally:
        if connection.sock is not None:
            connection.sock.close()
        connection.close()
    return record
