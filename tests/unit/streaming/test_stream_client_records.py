"""What the streaming client (latte.triton.streams, behind `latte bench` and the streaming
benchmarks) records of each request: a stream the server ended before a request's final
response is that request's error, and the next request opens a stream of its own."""

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import tritonclient.grpc.aio as aioclient

from latte.triton import streams


def result(piece, final=False, request="0"):
    parameters = {"triton_final_response": SimpleNamespace(bool_param=True)} if final else {}
    return SimpleNamespace(as_numpy=lambda name: np.array([piece], dtype=object),
                           get_response=lambda: SimpleNamespace(parameters=parameters, id=request))


class ScriptedStream:
    """A gRPC stream that yields its script's (result, error) pairs, then ends."""

    def __init__(self, script):
        self.script = list(script)

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.script:
            raise StopAsyncIteration
        return self.script.pop(0)

    def cancel(self):
        self.script = []


def test_a_stream_ended_before_the_final_response_is_that_requests_error(monkeypatch):
    scripts = [[(result(b"a"), None), (result(b"b"), None)],          # ends with no final response
               [(result(b"c", request="1"), None), (result(b"", final=True, request="1"), None)]]
    records, opened = run_client(monkeypatch, scripts)
    assert records == [(b"one", [b"a", b"b"], "the stream ended before the request's final response"),
                       (b"two", [b"c", b""], None)]
    assert len(opened) == 2


def run_client(monkeypatch, scripts):
    """The client's (prompt, pieces, error) records of two requests, one and two, sent over
    streams that play `scripts` in turn; and the scripts of the streams it opened."""
    opened = []
    monkeypatch.setattr(aioclient, "InferenceServerClient", scripted_client(scripts, opened))
    records = []
    asyncio.run(streams._client("localhost:0", "textgen", [b"one", b"two"], {"max_tokens": 2}, True, records,
                                until=time.perf_counter() + 60))
    return [(r.prompt, r.pieces, r.error) for r in records], opened


def scripted_client(scripts, opened):
    class ScriptedClient:
        def __init__(self, url):
            pass

        def stream_infer(self, requests):
            opened.append(scripts[len(opened)])
            return ScriptedStream(opened[-1])

        async def close(self):
            pass

    return ScriptedClient


def test_what_a_request_sends_after_its_error_is_not_counted_for_the_next_request(monkeypatch):
    # A server may send an error that is not the request's final response, then more of it.
    scripts = [[(None, "the model refused a token"), (result(b"late"), None), (result(b"", final=True), None),
                (result(b"c", request="1"), None), (result(b"", final=True, request="1"), None)]]
    records, opened = run_client(monkeypatch, scripts)
    assert records == [(b"one", [], "the model refused a token"), (b"two", [b"c", b""], None)]
    assert len(opened) == 1
