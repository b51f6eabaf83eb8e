"""`latte demo`: the main job end to end on the bundled examples."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict

import numpy as np

from latte.triton.client import infer_inputs
from latte.triton.locate import TritonInstall


def run_demo(workdir: Path, install: TritonInstall) -> int:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from rich.console import Console
    from rich.table import Table

    from latte.examples import EXAMPLES, build_examples, reference_runner
    from latte.triton import TritonServer
    from latte.triton.perf import run_perf_analyzer, write_input_data

    console = Console(width=max(Console().width, 110))
    workdir = Path(workdir).resolve()
    repo = workdir / "repository"
    console.rule("[bold]1. Example models (built locally, exported to TorchScript and ONNX)")
    started = time.perf_counter()
    build_examples(repo)
    manifest = json.loads((repo / "examples.json").read_text())
    contenders = write_ranker_contenders(repo, workdir / "ranker-build")
    console.print(f"wrote {len(manifest)} models to {repo}, and the ranker twice ({', '.join(contenders.values())}), "
                  f"in {time.perf_counter() - started:.1f} s")

    console.rule("[bold]2. tritonserver with backend \"latte\"")
    server = TritonServer(repo, install=install, log_path=workdir / "tritonserver.log")
    started = time.perf_counter()
    # The clients close before the server stops: tritonserver waits for open HTTP connections
    # to close, up to its exit timeout (30 s), before it stops.
    with server, httpclient.InferenceServerClient(server.http_url) as http, \
            grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        console.print(f"ready in {time.perf_counter() - started:.1f} s: http {server.http_url}  grpc {server.grpc_url}  "
                      f"metrics {server.metrics_url}  (log {server.log_path})")

        console.rule("[bold]3. Real requests over HTTP and gRPC, checked against the same model in-process")
        rng = np.random.default_rng(7)
        table = Table("model", "protocol", "rows", "output", "max |server - in-process|", "round trip ms")
        worst = 0.0
        for model, info in manifest.items():
            example = EXAMPLES[info["example"]]
            reference = reference_runner(repo, model)
            for protocol, client, module in (("HTTP", http, httpclient), ("gRPC", grpc, grpcclient)):
                # The first call of a connection pays for its set-up; time the second.
                client.infer(model, infer_inputs(module, example.sample(1, rng)))
                feed = example.sample(4, rng)
                t0 = time.perf_counter()
                result = client.infer(model, infer_inputs(module, feed))
                elapsed = (time.perf_counter() - t0) * 1000
                name = example.outputs[0].name
                got = result.as_numpy(name)
                diff = float(np.max(np.abs(got - reference(feed)[name])))
                worst = max(worst, diff)
                table.add_row(model, protocol, "4", f"{name} {list(got.shape)}", f"{diff:.2e}", f"{elapsed:.2f}")
        console.print(table)

        bad = {"features": np.ones((1, 16), dtype=np.float64)}
        try:
            http.infer("mlp_onnx", infer_inputs(httpclient, bad))
            console.print("[red]a request with the wrong data type was accepted")
            return 1
        except Exception as exc:  # tritonclient raises InferenceServerException
            console.print(f"wrong data type -> clear error: [yellow]{exc}")
        good = EXAMPLES["mlp"].sample(1, rng)
        http.infer("mlp_onnx", infer_inputs(httpclient, good))
        console.print("the next good request succeeds: [green]ok")

        same_as_stock = _against_stock(console, workdir, server, contenders, rng)
    fused_ok = _fused_pipeline(console, workdir, install)
    streamed_ok = _streaming(console, workdir, install)
    console.rule("[bold]done")
    console.print(f"server stopped; every answer matched the in-process model within {worst:.1e}")
    return 0 if worst <= 1e-4 and same_as_stock and fused_ok and streamed_ok else 1


RANKER_SLO_MS = 100.0


def write_ranker_contenders(repo: Path, build: Path) -> Dict[str, str]:
    """The ranker (ragged item histories -> a 97 MB embedding bag and MLP tower) twice in
    `repo`, from one ONNX file: with backend "latte", and with Triton's stock Python backend
    running it one request at a time, as its documentation shows. Same batch size, queue delay,
    one instance and one intra-op thread each. Returns role -> model name."""
    from latte.examples import CATALOG, export, write_served_copy

    example = CATALOG["ranker"]
    source = export(example, build)["onnx"]
    names = {"latte": "ranker_latte", "stock": "ranker_stock"}
    for role, backend in (("latte", "latte"), ("stock", "python")):
        write_served_copy(repo, example, source, names[role], backend,
                          dynamic_batching={"max_queue_delay_microseconds": 2000})
    return names


def _against_stock(console, workdir: Path, server, contenders: Dict[str, str], rng) -> bool:
    """latte and the stock Python backend on the ranker in one server: the same answers, then
    throughput at the best level within the P99 bound and P50 at concurrency 1, with the ratios."""
    import tritonclient.grpc as grpcclient
    from rich.table import Table

    from latte.examples import CATALOG
    from latte.triton.perf import run_perf_analyzer, write_input_data

    console.rule("[bold]4. latte against Triton's stock Python backend: the ranker, item histories of 1..64 ids")
    example = CATALOG["ranker"]
    samples = [{k: v[0] for k, v in example.sample(1, rng, length=int(n)).items()}
               for n in rng.integers(1, example.max_sequence_length + 1, 64)]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    worst = 0.0
    for sample in samples[:8]:
        answers = [grpc.infer(contenders[role], infer_inputs(grpcclient, {k: v[None] for k, v in sample.items()}))
                   .as_numpy("scores") for role in ("latte", "stock")]
        worst = max(worst, float(np.max(np.abs(answers[0] - answers[1]))))
    same = worst <= 1e-4
    console.print(f"8 histories sent to both: max |latte - stock| {worst:.1e} ({'ok' if same else 'DIFFER'})")
    data = write_input_data(workdir / "ranker_inputs.json", samples)
    points = {}
    table = Table("served by", "concurrency", "infer/s", "p50 ms", "p99 ms")
    for level in (1, 8, 32):
        for role in ("stock", "latte"):
            (point,) = run_perf_analyzer(contenders[role], server.grpc_url, concurrency=[level], input_data=data,
                                         measurement_ms=1500, max_trials=4, stability_percentage=50)
            points[(role, level)] = point
            label = "latte" if role == "latte" else "stock Python backend"
            table.add_row(label, str(level), f"{point.throughput:.0f}", f"{point.p50_ms:.2f}", f"{point.p99_ms:.2f}")
    console.print(table)
    best = {role: max((p.throughput for (r, _), p in points.items() if r == role and p.p99_ms <= RANKER_SLO_MS),
                      default=0.0) for role in ("latte", "stock")}
    p50 = points[("latte", 1)].p50_ms / max(1e-9, points[("stock", 1)].p50_ms)
    ratio = f"{best['latte'] / best['stock']:.2f}x" if best["stock"] > 0 else "- (no stock level within it)"
    console.print(f"latte / stock: [bold]{ratio}[/bold] the throughput at the best level with P99 <= "
                  f"{RANKER_SLO_MS:.0f} ms, P50 at concurrency 1 {p50:.2f}x (one short run on this machine as it "
                  "is now; docs/benchmarks.md, \"Serving\", has quiet, interleaved figures)")
    return same


def _fused_pipeline(console, workdir: Path, install: TritonInstall) -> bool:
    """A hand-written Triton pipeline (python tokenize -> latte encoder -> python normalize, an
    ensemble) next to the same repository after `latte fuse`, in one tritonserver: answers
    compared, then each measured with perf_analyzer; the ratio printed."""
    import re
    import shutil

    import tritonclient.grpc as grpcclient
    from rich.table import Table

    from latte.examples.pipeline import PIPELINES, write_hand_written_repository
    from latte.generator.fuse import fuse_repository
    from latte.triton import TritonServer
    from latte.triton.perf import run_perf_analyzer, write_input_data

    console.rule("[bold]5. A pipeline: Triton's ensemble of three models, and the same after `latte fuse`")
    work = workdir / "pipeline"
    if work.exists():
        shutil.rmtree(work)
    repo = write_hand_written_repository(work / "repo", "latte")
    fusion = fuse_repository(repo, "embed_text", work / "fused")
    for line in fusion.summary():
        console.print(f"latte fuse {repo.name} --ensemble embed_text: {line}")
    served = work / "served"  # the ensemble as embed_text, the fused model beside it as embed_text_fused
    shutil.copytree(repo, served)
    shutil.copytree(work / "fused" / "embed_text", served / "embed_text_fused")
    config = served / "embed_text_fused" / "config.pbtxt"
    config.write_text(re.sub(r'^name: ".*"$', 'name: "embed_text_fused"', config.read_text(), count=1, flags=re.M))
    requests = PIPELINES["text"].requests(64)
    data = write_input_data(work / "texts.json", [{k: v[0] for k, v in r.items()} for r in requests])
    with TritonServer(served, install=install, log_path=work / "tritonserver.log") as server:
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        same = True
        for request in requests[:8]:
            answers = []
            for model in ("embed_text", "embed_text_fused"):
                tensor = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
                tensor.set_data_from_numpy(request["TEXT"])
                answers.append(grpc.infer(model, [tensor]).as_numpy("EMBEDDING"))
            same = same and np.array_equal(*answers)
        console.print(f"8 texts sent to both, one at a time: answers {'equal bit for bit' if same else 'DIFFER'}")
        figures = {}
        table = Table("served as", "concurrency", "infer/s", "p50 ms", "p99 ms")
        for level in (1, 16):
            for model in ("embed_text", "embed_text_fused"):
                (point,) = run_perf_analyzer(model, server.grpc_url, concurrency=[level], input_data=data,
                                             measurement_ms=1500, max_trials=6, stability_percentage=50)
                figures[(model, level)] = point
                label = "Triton ensemble" if model == "embed_text" else "fused (latte fuse)"
                table.add_row(label, str(level), f"{point.throughput:.0f}", f"{point.p50_ms:.2f}",
                              f"{point.p99_ms:.2f}")
        console.print(table)
    ratio = figures[("embed_text_fused", 16)].throughput / max(1e-9, figures[("embed_text", 16)].throughput)
    p50 = figures[("embed_text_fused", 1)].p50_ms / max(1e-9, figures[("embed_text", 1)].p50_ms)
    console.print(f"fused / ensemble: [bold]{ratio:.2f}x[/bold] the throughput at concurrency 16, P50 at "
                  f"concurrency 1 {p50:.2f}x (one short run on this machine as it is now; docs/benchmarks.md, "
                  "\"Pipelines\", has quiet, interleaved figures)")
    return same


def _streaming(console, workdir: Path, install: TritonInstall) -> bool:
    """The example transformer as a streaming model: streamed over gRPC as clients of Triton's
    vLLM backend stream, each text checked against the model run alone, then 16 concurrent
    streams against the stock thread-per-request decoupled model; the tokens/s ratio printed."""
    import shutil

    from rich.table import Table

    from latte.bench.streams import measure_streams
    from latte.examples.streams import generate_alone, write_stock_model, write_stream_model
    from latte.triton import TritonServer
    from latte.triton.streams import generate, run_streams

    console.rule("[bold]6. Streaming: a text generator batched continuously, against a stock decoupled model")
    work = workdir / "streaming"
    if work.exists():
        shutil.rmtree(work)
    repo = work / "repository"
    write_stream_model(repo, "textgen", "gpt")
    write_stock_model(repo, "textgen_stock", "gpt")
    prompts = [b"Once upon a time", b"The quick brown fox", b"hello", b"Streams join and leave"]
    with TritonServer(repo, install=install, log_path=work / "tritonserver.log") as server:
        first = generate(server.grpc_url, "textgen", prompts[0], max_tokens=24)
        console.print(f"{prompts[0].decode()!r} -> {first.text.decode()!r}: {len(first.pieces)} responses, first "
                      f"after {first.ttft * 1000:.1f} ms")
        same = all(record.error is None and record.text == generate_alone(repo / "textgen", record.prompt, 24)
                   for record in run_streams(server.grpc_url, "textgen", prompts, concurrency=4, max_tokens=24))
        console.print(f"4 concurrent streams: each text {'equals' if same else 'DIFFERS from'} the model run alone")
        table = Table("model", "streams", "tokens/s", "TTFT p50 ms", "inter-token p50 ms")
        rates = {}
        for model in ("textgen_stock", "textgen"):
            run_streams(server.grpc_url, model, prompts, concurrency=4, max_tokens=8)  # warm
            figures = measure_streams(server.grpc_url, model, 16, 3.0, 64, prompts)
            rates[model] = figures.tokens_per_s
            table.add_row("stock decoupled (a thread per request)" if model == "textgen_stock" else "latte",
                          "16", f"{figures.tokens_per_s:.0f}", f"{figures.ttft_p50_ms:.1f}", f"{figures.itl_p50_ms:.2f}")
        console.print(table)
    console.print(f"latte / stock: [bold]{rates['textgen'] / max(rates['textgen_stock'], 1e-9):.2f}x[/bold] the tokens/s "
                  "at 16 streams (one short run on this machine as it is now; docs/benchmarks.md, \"Streaming\", has "
                  "quiet, interleaved figures and the bound)")
    return same
