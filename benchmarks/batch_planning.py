"""Batch planning benchmark: cost-aware plans vs one bucket per batch vs no buckets, in process.

    nice .venv/bin/python benchmarks/batch_planning.py [--calls 300] [--rounds 7] [--json out.json]
    nice .venv/bin/python benchmarks/batch_planning.py --served [--rounds 3]   # through tritonserver

The example sequence encoder (ONNX, one intra-op thread) behind BatchEngine, as the latte
backend serves it (warmup, cost model measured at warmup, buffers from a BuddyArena), without
tritonserver. One trace of `execute` calls, each of 4..16 one-row requests with token lengths
uniform in 1..128 (what Triton's dynamic batcher hands the backend in the serving benchmark),
is replayed through every variant, the variants taking turns call by call, so both sides of
every ratio were measured milliseconds apart; each ratio is the median of per-round ratios.

With --served the same variants (but cost-default) are served by one tritonserver, each behind
Triton's dynamic batcher (max_queue_delay 500 us, one instance, one lane), and perf_analyzer
(gRPC, 256 variable-length requests) measures them in turn, round after round, at each
concurrency; ratios are medians of per-round ratios.

Variants:
  bucket        shape buckets 16,32,64,128; a batch holds one bucket (batch_planning: bucket)
  cost          the same buckets; the planner's cheapest plan under the warmup-measured cost model,
                each batch padded to its longest request (pad_to: longest, the default)
  cost-edge     as cost, each batch padded to its bucket's edge (pad_to: edge)
  cost-default  as cost, with the default cost model (what runs when warmup is off)
  no-buckets    bucket_edges: none; one batch per call padded to its longest request

The in-process figures, summarised, replace benchmarks/results/batch-planning.json, from which
docs/benchmarks.md is rendered (`.venv/bin/python -m latte.bench.page`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from google.protobuf.json_format import MessageToDict

from latte.backend import memory_resource
from latte.backend.batching import plan_batches
from latte.backend.buckets import BucketPlan
from latte.backend.config import parse_model_config
from latte.backend.engine import BatchEngine
from latte.backend.requests import ParsedRequest
from latte.bench.quiet import wait_until_quiet
from latte.bench.results import Table, Target, command_line, new_results, write_summary
from latte.backend.graph.graph import load_model
from latte.backend.warmup import measure_cost_model, warmup_calls
from latte.examples import EXAMPLES, export, model_context
from latte.generator.model_folder import write_model
from latte.generator.validate import parse_config_file
from latte.memory import BuddyArena

VARIANTS = {
    "bucket": {"batch_planning": "bucket"},
    "cost": {"batch_planning": "cost"},
    "cost-edge": {"batch_planning": "cost", "pad_to": "edge"},
    "cost-default": {"batch_planning": "cost", "warmup": "false"},
    "no-buckets": {"bucket_edges": "none"},
}


def build_engine(repo: Path, model_file: Path, name: str, parameters: dict):
    context = model_context(EXAMPLES["sequence"], "onnx", "model.onnx")
    context["name"] = name.replace("-", "_")
    context["parameters"] = {**context["parameters"], **parameters}
    model_dir = write_model(repo, context, {"model.onnx": model_file})
    config = MessageToDict(parse_config_file(model_dir / "config.pbtxt"), preserving_proto_field_name=True)
    spec = parse_model_config(config, model_dir, "1")
    serving = spec.serving
    arena = BuddyArena(serving.arena_bytes, "cpu")
    memory_resource.use(arena.empty)
    graph, _ = load_model(spec)  # a plain model: a graph of one model step
    engine = BatchEngine(spec, graph)
    engine.arena = arena  # keeps the arena alive as long as the engine
    # What LatteModel does at load.
    if serving.warmup:
        for call in warmup_calls(spec):
            engine.infer(call)
        if engine.planner.cost_model is not None:
            engine.planner.cost_model = measure_cost_model(engine)
    return engine


def make_trace(calls: int, seed: int):
    rng = np.random.default_rng(seed)
    trace = []
    for _ in range(calls):
        size = int(rng.integers(4, 17))
        trace.append([ParsedRequest(inputs={"tokens": rng.integers(1, 1000, size=(1, int(rng.integers(1, 129))),
                                                                   dtype=np.int64)}, rows=1)
                      for _ in range(size)])
    return trace


def run_call(engine: BatchEngine, call) -> float:
    started = time.perf_counter()
    outcomes = engine.infer(call)
    seconds = time.perf_counter() - started
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise RuntimeError(f"a request failed: {outcome}")
    return seconds


def replay(engine: BatchEngine, trace) -> float:
    return sum(run_call(engine, call) for call in trace)


def interleaved_round(engines: dict, trace, rotation: int) -> dict:
    """Seconds per variant for the whole trace, the variants taking turns call by call (in an
    order rotated per call), so a neighbour's burst of load falls on all of them alike."""
    names = list(engines)
    seconds = dict.fromkeys(names, 0.0)
    for i, call in enumerate(trace):
        shift = (i + rotation) % len(names)
        for name in names[shift:] + names[:shift]:
            seconds[name] += run_call(engines[name], call)
    return seconds


def batch_shape(engine: BatchEngine, trace):
    """Model calls per execute and padded positions per row of the variant's plans."""
    engine.runner.take_records()
    replay(engine, trace)
    records = engine.runner.take_records()
    rows = sum(r.rows for r in records)
    return len(records) / len(trace), sum(r.rows * (r.padded_length or 0) for r in records) / rows


def planning_cost_us(engine: BatchEngine, trace, repeats: int = 5) -> float:
    """Microseconds per execute spent choosing the batches (no model call)."""
    items = [[(i, r) for i, r in enumerate(call)] for call in trace]
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for call in items:
            plan_batches(engine.spec, call, engine.planner.buckets, engine.planner.cost_model)
        best = min(best, time.perf_counter() - started)
    return best / len(trace) * 1e6


def served(rounds: int, concurrency: list, measurement_ms: int) -> dict:
    """Infer/s per variant and concurrency, one list entry per round."""
    from latte.examples import build_examples
    from latte.triton import TritonServer
    from latte.triton.perf import PerfAnalyzerError, run_perf_analyzer, write_input_data

    work = Path(tempfile.mkdtemp(prefix="latte-batch-planning-"))
    repo = build_examples(work / "repo", names=["sequence"])
    source = repo / "sequence_onnx" / "1" / "model.onnx"
    models = {}
    for name in ("bucket", "cost", "no-buckets"):
        context = model_context(EXAMPLES["sequence"], "onnx", "model.onnx")
        context["name"] = "sequence_" + name.replace("-", "_")
        context["parameters"] = {**context["parameters"], "lanes": "1", **VARIANTS[name]}
        write_model(repo, context, {"model.onnx": source})
        models[name] = context["name"]
    for example_model in ("sequence_onnx", "sequence_torchscript"):
        shutil.rmtree(repo / example_model)  # only the variants load (and time themselves) at start
    rng = np.random.default_rng(5)
    data = write_input_data(work / "inputs.json",
                            [{"tokens": EXAMPLES["sequence"].sample(1, rng)["tokens"][0]} for _ in range(256)])
    figures = {(name, c): [] for name in models for c in concurrency}
    with TritonServer(repo, log_path=work / "tritonserver.log") as server:
        for line in server.log().splitlines():
            if "batch planning=cost (" in line:
                print(line.split("batch planning=")[-1].rstrip(')"'))
        names = list(models)
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                for c in concurrency:
                    try:
                        point = run_perf_analyzer(models[name], server.grpc_url, concurrency=[c], input_data=data,
                                                  measurement_ms=measurement_ms, max_trials=6,
                                                  stability_percentage=30)[0]
                    except PerfAnalyzerError as exc:  # a point that never settles: left out, said so
                        figures[(name, c)].append(None)
                        print(f"round {r + 1} {name:<11} concurrency {c:>2}: no stable measurement "
                              f"({str(exc).splitlines()[-1]})", flush=True)
                        continue
                    figures[(name, c)].append(point.throughput)
                    print(f"round {r + 1} {name:<11} concurrency {c:>2}: {point.throughput:7.0f} infer/s, "
                          f"P99 {point.p99_ms:.1f} ms", flush=True)
    return figures


def report_served(figures: dict, concurrency: list) -> dict:
    ratios = {}
    print(f"\n{'variant':<12}" + "".join(f"{f'conc {c} infer/s':>22}" for c in concurrency))
    for name in ("bucket", "cost", "no-buckets"):
        cells = [[x for x in figures[(name, c)] if x is not None] for c in concurrency]
        print(f"{name:<12}" + "".join(f"{f'{statistics.median(v):.0f} ({min(v):.0f}..{max(v):.0f})':>22}"
                                      if v else f"{'-':>22}" for v in cells))
    for c in concurrency:
        for other in ("bucket", "no-buckets"):
            pairs = [(a, b) for a, b in zip(figures[("cost", c)], figures[(other, c)]) if a and b]
            if not pairs:
                continue
            ratio = statistics.median(a / b for a, b in pairs)
            ratios[f"cost / {other} @ concurrency {c}"] = ratio
            print(f"cost / {other:<11} at concurrency {c:>2}: {ratio:.3f}x ({len(pairs)} rounds)")
    return ratios


HERE = Path(__file__).resolve().parent


def summarize(per_round: dict, shapes: dict, planning: dict, ratios: dict, calls: int, rows: int, rounds: int) -> dict:
    best = ratios["cost / bucket"] > 1 and ratios["cost / no-buckets"] > 1
    return dict(
        summary=(f"In process, no tritonserver: the example sequence encoder (ONNX, one intra-op thread) behind "
                 f"`BatchEngine` as the backend builds it. One trace of {calls} `execute` calls ({rows} one-row "
                 f"requests, 4..16 a call, token lengths uniform in 1..128) replayed through every variant, the "
                 f"variants taking turns call by call; medians of {rounds} rounds, ratios the medians of per-round "
                 "ratios."),
        targets=[Target("cost planning faster than one bucket per batch and than buckets off",
                        ", ".join(f"{k} {v:.3f}x" for k, v in ratios.items() if k.startswith("cost /")),
                        "yes" if best else "no")],
        tables=[Table("", ["variant", "rows/s", "model calls per execute", "padded length per row",
                           "planning µs per execute"],
                      [[name, f"{statistics.median(values):,.0f}", f"{shapes[name][0]:.2f}", f"{shapes[name][1]:.1f}",
                        f"{planning[name]:.1f}"] for name, values in per_round.items()])])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="execute calls in the trace")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=20261121)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--served", action="store_true", help="measure through tritonserver and perf_analyzer")
    parser.add_argument("--concurrency", default="8,12", help="perf_analyzer concurrency levels (--served)")
    parser.add_argument("--measurement-ms", type=int, default=2000, help="perf_analyzer window (--served)")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where batch-planning.json, the page's input, goes (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        parser.error("--calls and --rounds must be >= 1")
    if args.served:
        try:
            levels = [int(c) for c in args.concurrency.split(",")]
        except ValueError:
            parser.error(f"--concurrency must be comma-separated integers such as 8,12, got {args.concurrency!r}")
        figures = served(args.rounds, levels, args.measurement_ms)
        ratios = report_served(figures, levels)
        if args.json:
            args.json.write_text(json.dumps({"infer_per_s": {f"{n} @ {c}": v for (n, c), v in figures.items()},
                                             "ratios": ratios}, indent=2) + "\n")
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        files = export(EXAMPLES["sequence"], Path(tmp) / "build")
        repo = Path(tmp) / "repo"
        engines = {name: build_engine(repo, files["onnx"], name, params) for name, params in VARIANTS.items()}
        for name in ("cost", "cost-default"):
            print(f"{name} cost model: {engines[name].planner.cost_model.describe()}")
        trace = make_trace(args.calls, args.seed)
        rows = sum(len(call) for call in trace)
        for engine in engines.values():
            replay(engine, trace[: max(1, len(trace) // 10)])  # settle caches and the arena
        record = new_results("batch-planning", "planning", "Batch planning: cost-aware plans against one bucket "
                             "per batch, in process", command_line("benchmarks/batch_planning.py", argv),
                             wait_until_quiet(log=print), HERE)

        names = list(engines)
        per_round = {name: [] for name in names}
        for r in range(args.rounds):
            for name, seconds in interleaved_round(engines, trace, r).items():
                per_round[name].append(rows / seconds)
        shapes = {name: batch_shape(engines[name], trace) for name in names}
        planning = {name: planning_cost_us(engines[name], trace) for name in names}

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(per_round[a], per_round[b]))

    print(f"\n{args.calls} execute calls, {rows} requests (4..16 per call, lengths 1..128), "
          f"{args.rounds} rounds; {platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"{'variant':<14}{'rows/s (median)':>16}{'min..max':>18}{'calls/execute':>15}"
          f"{'padded len/row':>16}{'planning us/execute':>21}")
    for name in names:
        values = per_round[name]
        calls, padded = shapes[name]
        print(f"{name:<14}{statistics.median(values):>16.0f}{f'{min(values):.0f}..{max(values):.0f}':>18}"
              f"{calls:>15.2f}{padded:>16.1f}{planning[name]:>21.1f}")
    ratios = {"cost / bucket": ratio("cost", "bucket"), "cost / no-buckets": ratio("cost", "no-buckets"),
              "cost / cost-edge": ratio("cost", "cost-edge"),
              "cost-default / bucket": ratio("cost-default", "bucket"),
              "no-buckets / bucket": ratio("no-buckets", "bucket")}
    for label, value in ratios.items():
        print(f"{label:<24}{value:.3f}x")
    if args.json:
        args.json.write_text(json.dumps({
            "rows_per_s": per_round, "calls_per_execute": {n: s[0] for n, s in shapes.items()},
            "padded_length_per_row": {n: s[1] for n, s in shapes.items()},
            "planning_us_per_execute": planning, "ratios": ratios,
            "cost_model": {n: engines[n].planner.cost_model.describe() for n in ("cost", "cost-default")},
        }, indent=2) + "\n")
    summary = summarize(per_round, shapes, planning, ratios, args.calls, rows, args.rounds)
    print(f"wrote {write_summary(record, summary, args.results_dir, {'rows_per_s': per_round, 'ratios': ratios})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
