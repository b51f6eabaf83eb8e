"""Serving benchmark: the latte backend vs Triton's stock Python backend on the same model.

    .venv/bin/python benchmarks/serving.py [--slo-ms 50] [--concurrency 4:16:4] [--out results.json]

Both models serve the example sequence encoder (ONNX, token ids of length 1..128) in one
tritonserver, with the same dynamic batcher settings and the same thread budget (one
instance, one intra-op thread). perf_analyzer drives each with the same variable-length
inputs. A third figure, the in-process batched throughput of the same model on one thread,
is the limit of this machine. Printed: throughput at P99 within the SLO and the ratios.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from latte.examples import EXAMPLES, build_examples, model_context
from latte.generator.render import write_model
from latte.triton import TritonServer
from latte.triton.perf import run_perf_analyzer, write_input_data

HERE = Path(__file__).resolve().parent


def baseline_model(repo: Path, source: Path) -> str:
    """Add the stock-Python-backend copy of sequence_onnx to `repo`."""
    context = model_context(EXAMPLES["sequence"], "onnx", "model.onnx")
    context.update(name="sequence_python_baseline", backend="python", parameters={})
    model_dir = write_model(repo, context, {"model.onnx": source})
    shutil.copy(HERE / "baseline_python_model.py", model_dir / "1" / "model.py")
    return context["name"]


def in_process_limit(model_file: Path, samples, batch: int, seconds: float = 5.0) -> float:
    """Rows per second of the same ONNX model run in batches on one thread (padded per batch)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_file), sess_options=options, providers=["CPUExecutionProvider"])
    rows, started, i = 0, time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        group = [samples[(i + k) % len(samples)]["tokens"] for k in range(batch)]
        i += batch
        longest = max(len(g) for g in group)
        tokens = np.zeros((batch, longest), np.int64)
        for r, g in enumerate(group):
            tokens[r, :len(g)] = g
        session.run(None, {"tokens": tokens})
        rows += batch
    return rows / (time.perf_counter() - started)


def best_under_slo(points, slo_ms: float):
    ok = [p for p in points if p.p99_ms <= slo_ms]
    return max(ok, key=lambda p: p.throughput) if ok else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slo-ms", type=float, default=50.0, help="P99 latency objective")
    parser.add_argument("--concurrency", default="4:16:4", help="perf_analyzer concurrency range start:end:step")
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    start, end, step = (int(x) for x in args.concurrency.split(":"))
    levels = list(range(start, end + 1, step))

    work = Path(tempfile.mkdtemp(prefix="latte-serving-"))
    repo = build_examples(work / "repo", names=["sequence"])
    shutil.rmtree(repo / "sequence_torchscript")
    baseline = baseline_model(repo, repo / "sequence_onnx" / "1" / "model.onnx")
    rng = np.random.default_rng(5)
    samples = [{"tokens": EXAMPLES["sequence"].sample(1, rng)["tokens"][0]} for _ in range(256)]
    data = write_input_data(work / "inputs.json", samples)

    results = {}
    with TritonServer(repo, log_path=work / "tritonserver.log") as server:
        for model in ("sequence_onnx", baseline):
            print(f"measuring {model} at concurrency {levels} ...", flush=True)
            results[model] = run_perf_analyzer(model, server.grpc_url, concurrency=levels, input_data=data,
                                               measurement_ms=args.measurement_ms, max_trials=8,
                                               stability_percentage=30)
    limit = in_process_limit(repo / "sequence_onnx" / "1" / "model.onnx", samples, batch=32)

    print(f"\n{'model':28} {'conc':>5} {'infer/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for model, points in results.items():
        for p in points:
            print(f"{model:28} {p.concurrency:>5} {p.throughput:>9.0f} {p.p50_ms:>8.2f} {p.p99_ms:>8.2f}")
    latte = best_under_slo(results["sequence_onnx"], args.slo_ms)
    base = best_under_slo(results[baseline], args.slo_ms)
    print(f"\nthroughput at P99 <= {args.slo_ms:g} ms:")
    print(f"  latte backend            {latte.throughput if latte else 0:>9.0f} infer/s")
    print(f"  stock Python backend     {base.throughput if base else 0:>9.0f} infer/s")
    print(f"  in-process limit (1 thread, batch 32) {limit:>9.0f} rows/s")
    figures = {"slo_ms": args.slo_ms, "latte": latte.as_dict() if latte else None,
               "baseline": base.as_dict() if base else None, "in_process_limit": limit}
    if latte and base:
        figures["ratio_vs_python_backend"] = latte.throughput / base.throughput
        print(f"  latte / Python backend   {figures['ratio_vs_python_backend']:.2f}x   (target >= 3x)")
    if latte:
        figures["share_of_in_process_limit"] = latte.throughput / limit
        print(f"  latte / in-process limit {figures['share_of_in_process_limit']:.0%}    (target >= 85%)")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
