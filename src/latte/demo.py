"""`latte demo`: the main job end to end on the bundled examples."""

from __future__ import annotations

import json
import time
from pathlib import Path

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
    console.print(f"wrote {len(manifest)} models to {repo} in {time.perf_counter() - started:.1f} s")

    console.rule("[bold]2. tritonserver with backend \"latte\"")
    server = TritonServer(repo, install=install, log_path=workdir / "tritonserver.log")
    started = time.perf_counter()
    with server:
        console.print(f"ready in {time.perf_counter() - started:.1f} s: http {server.http_url}  grpc {server.grpc_url}  "
                      f"metrics {server.metrics_url}  (log {server.log_path})")

        console.rule("[bold]3. Real requests over HTTP and gRPC, checked against the same model in-process")
        http = httpclient.InferenceServerClient(server.http_url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
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

        console.rule("[bold]4. perf_analyzer: sequence_onnx, variable-length inputs (1..128 tokens)")
        samples = [{"tokens": EXAMPLES["sequence"].sample(1, rng)["tokens"][0]} for _ in range(64)]
        data = write_input_data(workdir / "sequence_inputs.json", samples)
        points = run_perf_analyzer("sequence_onnx", server.grpc_url, protocol="grpc", concurrency=[1, 2, 3, 4],
                                   input_data=data, measurement_ms=1000, max_trials=10,
                                   stability_percentage=50)
        perf = Table("concurrency", "infer/s", "p50 ms", "p90 ms", "p99 ms", "server queue us", "server compute us")
        for p in points:
            perf.add_row(str(p.concurrency), f"{p.throughput:.0f}", f"{p.p50_ms:.2f}", f"{p.p90_ms:.2f}",
                         f"{p.p99_ms:.2f}", f"{p.queue_us:.0f}", f"{p.compute_us:.0f}")
        console.print(perf)
    console.rule("[bold]done")
    console.print(f"server stopped; every answer matched the in-process model within {worst:.1e}")
    return 0 if worst <= 1e-4 else 1
