"""The example text generators under a real tritonserver: streamed over gRPC as Triton's vLLM
backend's clients stream, through the HTTP generate endpoints, cancelled mid-way, and beside
the stock thread-per-request model running the same programs."""

import json
import time

import numpy as np
import pytest

from conftest import assert_stopped_promptly

pytestmark = pytest.mark.integration

PROMPTS = [b"hello world", b"The quick brown fox", b"streams join and leave", b"a", b"0123456789" * 3]


@pytest.fixture(scope="module")
def streaming_server(tmp_path_factory):
    from latte.examples.streams import write_stock_model, write_stream_model
    from latte.triton import TritonServer

    work = tmp_path_factory.mktemp("streaming")
    repo = work / "repository"
    repo.mkdir()
    write_stream_model(repo, "textgen", "gpt", max_streams=8, joins_per_iteration=2)
    write_stream_model(repo, "textgen_gru", "gru", max_streams=8)
    write_stock_model(repo, "textgen_stock", "gpt")
    with TritonServer(repo, log_path=work / "tritonserver.log") as running:
        running.repo = repo
        yield running
    # The gRPC clients close their streams as the server ends them: closed before that, a stream
    # can keep its model from unloading, and the stop waits out its exit timeout (streams.py).
    assert_stopped_promptly(running)


def metric(server, name, **labels):
    import urllib.request

    text = urllib.request.urlopen(server.metrics_url).read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()) \
                and 'model="textgen"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.parametrize("model", ["textgen", "textgen_gru"])
def test_concurrent_streams_each_equal_the_model_run_alone(streaming_server, model):
    from latte.examples.streams import generate_alone
    from latte.triton.streams import run_streams

    records = run_streams(streaming_server.grpc_url, model, PROMPTS, concurrency=len(PROMPTS), max_tokens=24)
    assert len(records) == len(PROMPTS)
    for record in records:
        assert record.error is None
        assert record.text == generate_alone(streaming_server.repo / model, record.prompt, 24)
        assert len(record.pieces) == len(record.text)  # one response per token


def test_the_served_model_publishes_its_time_to_first_output_and_between_outputs(streaming_server):
    from latte.triton.streams import run_streams

    before = metric(streaming_server, "latte_stream_first_output_us_count") or 0
    records = run_streams(streaming_server.grpc_url, "textgen", PROMPTS[:2], concurrency=2, max_tokens=8,
                          ignore_eos=True)
    assert [len(r.pieces) for r in records] == [8, 8]
    for _ in range(30):  # the figures are published once a second
        if (metric(streaming_server, "latte_stream_first_output_us_count") or 0) >= before + 2:
            break
        time.sleep(0.2)
    assert metric(streaming_server, "latte_stream_first_output_us_count") >= before + 2
    assert metric(streaming_server, "latte_stream_inter_output_us_count") >= 2 * 7
    assert metric(streaming_server, "latte_stream_inter_output_us_bucket", le="+Inf") >= 2 * 7


def test_the_stock_model_says_the_same_so_the_benchmark_compares_like_with_like(streaming_server):
    from latte.triton.streams import generate

    ours = generate(streaming_server.grpc_url, "textgen", b"compare me", max_tokens=20)
    stock = generate(streaming_server.grpc_url, "textgen_stock", b"compare me", max_tokens=20)
    assert ours.text == stock.text and len(ours.pieces) == len(stock.pieces) == 20


def test_http_generate_answers_as_for_the_vllm_backend(streaming_server):
    import urllib.request

    from latte.examples.streams import generate_alone

    body = json.dumps({"text_input": "hello", "max_tokens": 8}).encode()
    answer = urllib.request.urlopen(urllib.request.Request(
        f"http://{streaming_server.http_url}/v2/models/textgen/generate", data=body,
        headers={"Content-Type": "application/json"}), timeout=30).read()
    assert json.loads(answer)["text_output"] == "hello" + generate_alone(streaming_server.repo / "textgen",
                                                                         b"hello", 8).decode()
    body = json.dumps({"text_input": "hello", "max_tokens": 5, "stream": True}).encode()
    events = urllib.request.urlopen(urllib.request.Request(
        f"http://{streaming_server.http_url}/v2/models/textgen/generate_stream", data=body,
        headers={"Content-Type": "application/json"}), timeout=30).read().decode()
    pieces = [json.loads(line[len("data: "):])["text_output"] for line in events.splitlines()
              if line.startswith("data: ")]
    assert "".join(pieces) == generate_alone(streaming_server.repo / "textgen", b"hello", 5).decode()
    body = json.dumps({"text_input": "hello", "max_tokens": 3, "stream": True, "return_finish_reason": True}).encode()
    events = urllib.request.urlopen(urllib.request.Request(
        f"http://{streaming_server.http_url}/v2/models/textgen/generate_stream", data=body,
        headers={"Content-Type": "application/json"}), timeout=30).read().decode()
    reasons = [json.loads(line[len("data: "):])["finish_reason"] for line in events.splitlines()
               if line.startswith("data: ")]
    assert reasons == ["None", "None", "length"]


def test_the_vllm_backends_additional_outputs_come_where_asked_for(streaming_server):
    """A client of the vLLM backend's additional outputs (its docs' example: tritonclient's gRPC
    stream, return_finish_reason and return_num_output_tokens set) works unchanged."""
    import queue

    import tritonclient.grpc as grpcclient

    from latte.examples.streams import generate_alone

    def stream(model, prompt, flags, max_tokens, ignore_eos=True):
        """The responses up to the one with the final flag."""
        inputs = []
        sampling = json.dumps({"max_tokens": max_tokens, "ignore_eos": ignore_eos}).encode()
        for name, value in [("text_input", np.array([prompt], dtype=object)), ("stream", np.array([True])),
                            ("sampling_parameters", np.array([sampling], dtype=object)),
                            *((flag, np.array([True])) for flag in flags)]:
            inputs.append(grpcclient.InferInput(name, list(value.shape), "BYTES" if value.dtype == object else "BOOL"))
            inputs[-1].set_data_from_numpy(value)
        results, answers = queue.Queue(), []
        with grpcclient.InferenceServerClient(streaming_server.grpc_url) as client:
            client.start_stream(callback=lambda result, error: results.put(error or result))
            client.async_stream_infer(model, inputs=inputs, enable_empty_final_response=True)
            while not answers or not answers[-1].get_response().parameters["triton_final_response"].bool_param:
                answers.append(results.get(timeout=30))
                assert not isinstance(answers[-1], Exception), answers[-1]
            client.stop_stream()
        return answers

    asked = stream("textgen", b"hello", ["return_finish_reason", "return_num_output_tokens"], 6)
    assert [a.as_numpy("finish_reason").tolist() for a in asked] == [[b"None"]] * 5 + [[b"length"]]
    assert [a.as_numpy("num_output_tokens").tolist() for a in asked] == [[1]] * 6
    assert b"".join(a.as_numpy("text_output")[0] for a in asked) == generate_alone(
        streaming_server.repo / "textgen", b"hello", 6, ignore_eos=True)
    plain = stream("textgen", b"hello", [], 3)
    assert [(a.as_numpy("finish_reason"), a.as_numpy("num_output_tokens")) for a in plain] == [(None, None)] * 3
    # This prompt's text ends on the end token: a last response of the empty text says so.
    text = generate_alone(streaming_server.repo / "textgen_gru", b"9", 64)
    ending = stream("textgen_gru", b"9", ["return_finish_reason"], 64, ignore_eos=False)
    assert len(ending) == len(text) + 1 and ending[-1].as_numpy("text_output").tolist() == [b""]
    assert [a.as_numpy("finish_reason").tolist() for a in ending] == [[b"None"]] * len(text) + [[b"stop"]]


def test_a_bad_prompt_gets_one_clear_error_and_the_next_stream_succeeds(streaming_server):
    from latte.triton.streams import generate

    bad = generate(streaming_server.grpc_url, "textgen", b"", max_tokens=5)
    assert "step 'tokenize': the prompt is empty" in bad.error and not bad.pieces
    wrong = generate(streaming_server.grpc_url, "textgen", b"ok", max_tokens=-3)
    assert "'max_tokens' must be an integer >= 1, got -3" in wrong.error
    good = generate(streaming_server.grpc_url, "textgen", b"ok", max_tokens=5)
    assert good.error is None and len(good.pieces) == 5


def test_cancelled_streams_give_their_state_back(streaming_server):
    """Clients that go away mid-stream (their HTTP connections closed: tritonserver 2.51's gRPC
    frontend can deadlock when a client cancels a gRPC stream while responses are sent on it,
    docs/streaming.md) free their streams' state."""
    from concurrent.futures import ThreadPoolExecutor

    from latte.triton.streams import generate, http_stream

    with ThreadPoolExecutor(4) as pool:
        records = list(pool.map(lambda i: http_stream(streaming_server.http_url, "textgen", PROMPTS[i], 200,
                                                      cancel_after=3 if i % 2 == 0 else None, ignore_eos=True),
                                range(4)))
    assert [r.cancelled for r in records] == [True, False, True, False]
    assert all(len(r.pieces) == 200 for r in records if not r.cancelled)
    # within the cancellation check (100 ms) and a publication of the figures (1 s)
    for _ in range(50):
        time.sleep(0.2)
        if metric(streaming_server, "latte_streams", state="live") == 0 and \
                (metric(streaming_server, "latte_streams_total", outcome="cancelled") or 0) >= 2:
            break
    assert metric(streaming_server, "latte_streams", state="live") == 0
    assert metric(streaming_server, "latte_stream_cache_blocks", state="taken") == 0
    assert metric(streaming_server, "latte_streams_total", outcome="cancelled") >= 2
    assert generate(streaming_server.grpc_url, "textgen", b"after", max_tokens=4).error is None


def test_latte_bench_measures_a_decoupled_model_as_streams(streaming_server, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    latte = Path(sys.executable).parent / "latte"
    done = subprocess.run([str(latte), "bench", "--url", streaming_server.http_url, "--grpc-url",
                           streaming_server.grpc_url, "--metrics-url", streaming_server.metrics_url, "--model", "textgen",
                           "--concurrency", "1,4", "--seconds", "1", "--max-tokens", "6", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "textgen" / "streams.json").read_text())
    assert [p["concurrent"] for p in result["points"]] == [1, 4]
    for point in result["points"]:
        assert point["tokens_per_s"] > 0 and point["errors"] == 0 and point["ttft_p50_ms"] > 0
        assert point["started"] > 0
        # Streams open at once, on average: never more than the clients, and at 4 clients more
        # than one (4 clients that each spent as much time between streams as in one would still
        # hold 2), which streams sent one at a time cannot reach, however slow the box.
        assert 0 < point["in_flight"] <= point["concurrent"] + 0.01
    one, four = (p["in_flight"] for p in result["points"])
    assert four > 1.0 and four > one
