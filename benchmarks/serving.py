"""Serving benchmark: the latte backend vs Triton's stock Python backend on the same model.

    .venv/bin/python benchmarks/serving.py [--model ranker|sequence] [--slo-ms MS]
                                           [--concurrency 4,8,16] [--out results.json]

Both serve the same ONNX file in one tritonserver, with the same dynamic batcher settings
and the same thread budget (one instance, one intra-op thread): `ranker` (the default; item
histories of length 1..64 into a 97 MB embedding-bag + MLP tower, the shape of a
production ranking model) or `sequence` (the bundled 32-wide attention encoder, token ids
of length 1..128; small enough that per-request serving overhead dominates). perf_analyzer
drives each with the same variable-length inputs. A third figure, the in-process batched
throughput of the same model on one thread (best of a few batch sizes, padded per batch),
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

from latte.examples import CATALOG, build_examples, model_context
from latte.generator.render import write_model
from latte.triton import TritonServer
from latte.triton.perf import PerfAnalyzerError, run_perf_analyzer, write_input_data

HERE = Path(__file__).resolve().parent
# Per model: the P99 objective and the concurrency levels that reach each contender's peak.
# Both contenders get the same dynamic batcher delay (queue_delay_us).
DEFAULTS = {"ranker": {"slo_ms": 100.0, "concurrency": "8,16,32,64,96,128", "queue_delay_us": 2000},
            "sequence": {"slo_ms": 50.0, "concurrency": "4,8,12,16", "queue_delay_us": 500}}
# --ablation: latte with one setting changed at a time.
ABLATIONS = {
    "scheduler_lane": {"scheduler": "affinity"},
    "bucket_planning": {"batch_planning": "bucket"},
    "respond_per_call": {"respond": "per_call"},
    "pipeline": {"pipeline": "true"},
    "2lanes": {"lanes": "2"},
}


def baseline_model(repo: Path, example, source: Path, queue_delay_us: int) -> str:
    """Add the stock-Python-backend copy of the model to `repo`."""
    context = model_context(example, "onnx", "model.onnx")
    context.update(name=f"{example.name}_python_baseline", backend="python", parameters={},
                   dynamic_batching={"max_queue_delay_microseconds": queue_delay_us})
    model_dir = write_model(repo, context, {"model.onnx": source})
    shutil.copy(HERE / "baseline_python_model.py", model_dir / "1" / "model.py")
    return context["name"]


def latte_variant(repo: Path, example, source: Path, name: str, queue_delay_us: int = 500, **parameters) -> str:
    """A copy of the latte model with some parameters changed (an ablation)."""
    context = model_context(example, "onnx", "model.onnx")
    context["name"] = name
    context["dynamic_batching"] = {"max_queue_delay_microseconds": queue_delay_us}
    context["parameters"] = {**context["parameters"], **parameters}
    write_model(repo, context, {"model.onnx": source})
    return name


def in_process_rate(session, input_name: str, samples, batch: int, seconds: float) -> float:
    """Rows per second of padded batches of `batch` samples through `session`."""
    rows, started, i = 0, time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        group = [samples[(i + k) % len(samples)][input_name] for k in range(batch)]
        i += batch
        longest = max(len(g) for g in group)
        padded = np.zeros((batch, longest), np.int64)
        for r, g in enumerate(group):
            padded[r, :len(g)] = g
        session.run(None, {input_name: padded})
        rows += batch
    return rows / (time.perf_counter() - started)


def in_process_limit(model_file: Path, input_name: str, samples, batches, seconds: float = 4.0):
    """The best rows/s of the same ONNX model on one thread over a few batch sizes, and that size."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_file), sess_options=options, providers=["CPUExecutionProvider"])
    rates = {b: in_process_rate(session, input_name, samples, b, seconds) for b in batches}
    best = max(rates, key=rates.get)
    return rates[best], best


def measure(model: str, url: str, level: int, data: Path, measurement_ms: int):
    """One concurrency level (perf_analyzer sweeps evenly spaced levels only); a level that
    cannot settle within 30 % on this shared machine is measured again at 100 % and flagged."""
    for stability in (30, 100):
        try:
            (point,) = run_perf_analyzer(model, url, concurrency=[level], input_data=data,
                                         measurement_ms=measurement_ms, max_trials=8, stability_percentage=stability)
        except PerfAnalyzerError as exc:
            if "stable" not in str(exc) or stability == 100:
                raise
            continue
        point.stability_percentage = stability
        return point


def best_under_slo(points, slo_ms: float):
    ok = [p for p in points if p.p99_ms <= slo_ms]
    return max(ok, key=lambda p: p.throughput) if ok else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(DEFAULTS), default="ranker")
    parser.add_argument("--slo-ms", type=float, help="P99 latency objective (default: per model)")
    parser.add_argument("--concurrency", help="perf_analyzer concurrency levels, comma-separated (default: per model)")
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--ablation", action="store_true",
                        help="also measure latte with one setting changed at a time (ABLATIONS)")
    args = parser.parse_args(argv)
    example = CATALOG[args.model]
    slo_ms = args.slo_ms or DEFAULTS[args.model]["slo_ms"]
    levels = [int(x) for x in (args.concurrency or DEFAULTS[args.model]["concurrency"]).split(",")]

    work = Path(tempfile.mkdtemp(prefix="latte-serving-"))
    repo = build_examples(work / "repo", names=[example.name])
    shutil.rmtree(repo / f"{example.name}_torchscript")
    # Only the contenders below are served; the file they share stays outside the repository.
    source = Path(shutil.move(str(repo / f"{example.name}_onnx" / "1" / "model.onnx"), work / "model.onnx"))
    shutil.rmtree(repo / f"{example.name}_onnx")
    delay = DEFAULTS[args.model]["queue_delay_us"]
    baseline = baseline_model(repo, example, source, delay)
    # The same thread budget as the baseline: one lane, one intra-op thread.
    latte = latte_variant(repo, example, source, f"{example.name}_latte", delay, lanes="1")
    variants = [latte_variant(repo, example, source, f"{example.name}_latte_{label}", delay, **{"lanes": "1", **changed})
                for label, changed in ABLATIONS.items()] if args.ablation else []
    rng = np.random.default_rng(5)
    input_name = example.inputs[0].name
    samples = [{input_name: example.sample(1, rng)[input_name][0]} for _ in range(256)]
    data = write_input_data(work / "inputs.json", samples)

    results = {}
    with TritonServer(repo, log_path=work / "tritonserver.log") as server:
        for model in [latte, baseline] + variants:
            print(f"measuring {model} at concurrency {levels} ...", flush=True)
            results[model] = [measure(model, server.grpc_url, level, data, args.measurement_ms) for level in levels]
    batches = sorted({b for b in (8, 16, 32, example.max_batch_size) if b <= example.max_batch_size})
    limit, limit_batch = in_process_limit(source, input_name, samples, batches)

    print(f"\n{'model':28} {'conc':>5} {'infer/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for model, points in results.items():
        for p in points:
            loose = " (settled only within 100 %)" if p.stability_percentage > 30 else ""
            print(f"{model:28} {p.concurrency:>5} {p.throughput:>9.0f} {p.p50_ms:>8.2f} {p.p99_ms:>8.2f}{loose}")
    best = {model: best_under_slo(points, slo_ms) for model, points in results.items()}
    latte = best[latte]
    base = best[baseline]
    print(f"\nthroughput at P99 <= {slo_ms:g} ms ({example.name}):")
    print(f"  latte backend            {latte.throughput if latte else 0:>9.0f} infer/s")
    print(f"  stock Python backend     {base.throughput if base else 0:>9.0f} infer/s")
    for model in variants:
        print(f"  {model:28} {best[model].throughput if best[model] else 0:>9.0f} infer/s")
    print(f"  in-process limit (1 thread, batch {limit_batch}) {limit:>9.0f} rows/s")
    figures = {"model": example.name, "slo_ms": slo_ms, "latte": latte.as_dict() if latte else None,
               "baseline": base.as_dict() if base else None, "in_process_limit": limit,
               "in_process_batch": limit_batch,
               "points": {model: [{**p.as_dict(), "stability_percentage": p.stability_percentage} for p in points] for model, points in results.items()}}
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
