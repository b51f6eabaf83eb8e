"""Pipelines benchmark: a fused latte model against Triton's ensemble of the same steps.

    .venv/bin/python benchmarks/pipelines.py [--pipeline text,image,branching] [--rounds 3]
                                             [--concurrency 1,16,64] [--measurement-ms 2000]
                                             [--format onnx|torchscript] [--gpus N] [--budget-s S]
                                             [--decompose] [--out results.json]
                                             [--results-dir benchmarks/results]

Per example pipeline (latte.examples.pipeline), `latte generate` renders it twice from one
spec and SLO (50 ms) and one tritonserver serves four contenders with the same inputs and
outputs:

- fused: the latte model `latte generate` makes of the ensemble (its name), every step in
  one process, batched;
- ensemble: `latte generate --no-fuse`'s Triton ensemble of the same step models (tokenize
  and normalize in Triton's Python backend, the encoder a latte model): every step its own
  model, every hop through Triton's core;
- stock: Triton's stock Python backend running the same steps (the same functions, the same
  ONNX files, one intra-op thread) in one `execute`, one request at a time: fused by hand;
- echo: a stock Python model with the same inputs and outputs that computes nothing, the
  least one hop costs.

stock and echo have the fused model's batching and instances. perf_analyzer (gRPC) sends the
same requests to each (one text or image per request; text word counts lognormal, median 24),
rounds interleaved with the contenders' order rotated; medians are reported. The limit any
model reached in one hop can serve here is H = 1 / (1/echo + 1/in-process), in-process being
the same steps on one thread in batches of 8 (texts length-sorted within windows of 64).

`--decompose` adds each step's time per request in the fused model, from its own counters
(latte_step_us_total), next to the whole request's wall time.

The run's figures, summarised, replace benchmarks/results/pipelines.json, from which
docs/benchmarks.md is rendered (`.venv/bin/python -m latte.bench.page`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, List

from google.protobuf import text_format

from latte.bench import cpu
from latte.bench.budget import rounds_within
from latte.bench.prometheus_scrape import scrape, split_key
from latte.bench.quiet import wait_until_quiet
from latte.bench.results import Chart, Series, Table, Target, command_line, cut_load, new_results, write_summary
from latte.examples.pipeline import PIPELINES, InProcess, side_by_side
from latte.generator.validate import parse_config_file
from latte.triton import TritonServer
from latte.triton.perf import write_input_data

# benchmarks/serving.py: one level measured, a stable median, each of a run's parts in one folder
from serving import best_level, level_figures, measure_served, median, p99_throughput_curve, run_each

HERE = Path(__file__).resolve().parent
SLO_MS = 50.0
ROLES = ("fused", "ensemble", "stock")


def add_python_contender(repo: Path, fused: str, name: str, script: str, with_graph: bool) -> str:
    """A stock Python model with the fused model's config (batching, instances, tensors)."""
    config = parse_config_file(repo / fused / "config.pbtxt")
    config.name = name
    config.backend = "python"
    config.ClearField("parameters")
    target = repo / name
    if target.exists():
        shutil.rmtree(target)
    version = target / "1"
    if with_graph:
        shutil.copytree(repo / fused / "1", version)
    else:
        version.mkdir(parents=True)
    shutil.copy(HERE / script, version / "model.py")
    (target / "config.pbtxt").write_text(text_format.MessageToString(config))
    return name


def step_models(repo: Path, ensemble: str) -> List[str]:
    return [step.model_name for step in parse_config_file(repo / ensemble / "config.pbtxt").ensemble_scheduling.step]


def in_process_rate(files: Path, name: str, requests, batch: int = 8, seconds: float = 3.0) -> float:
    """Requests/s of the pipeline's steps on one thread, in batches of `batch` (texts sorted by
    length within windows of 64: the best a batcher can do)."""
    import numpy as np

    run = InProcess(files, name)
    key = PIPELINES[name].input_name
    values = [r[key][0] for r in requests]
    if key == "TEXT":
        values = [v for w in range(0, len(values), 64) for v in sorted(values[w:w + 64], key=lambda t: len(t[0]))]
    batches = [np.stack(values[at:at + batch]) for at in range(0, len(values) - batch + 1, batch)]
    for b in batches[:4]:
        run({key: b})
    done, i, started = 0, 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        run({key: batches[i % len(batches)]})
        done += batch
        i += 1
    return done / (time.perf_counter() - started)


def step_counters(metrics_url: str, model: str) -> Dict[str, float]:
    values = scrape(metrics_url)
    found = {}
    for key, value in values.items():
        series, labels = split_key(key)
        if labels.get("model") != model:
            continue
        if series == "latte_step_us_total":
            found[labels["step"]] = found.get(labels["step"], 0.0) + value
        elif series == "latte_execute_requests_total":
            found["requests"] = found.get("requests", 0.0) + value
        elif series == "latte_execute_calls_total":
            found["calls"] = found.get("calls", 0.0) + value
    return found


def results_variant(args) -> str:
    """Another format, or the GPU, is a results file (and charts) of its own beside the page's
    CPU figures: "", "-torchscript", "-torchscript-gpu"."""
    return ("" if args.format == "onnx" else f"-{args.format}") + ("-gpu" if args.gpus else "")


def run_pipeline(name: str, args, work: Path) -> dict:
    example = PIPELINES[name]
    levels = [int(x) for x in args.concurrency.split(",")]
    top = max(levels)
    repo, names = side_by_side(work / name, name, slo_ms=SLO_MS, log=lambda line: print(f"  {line}", flush=True),
                               model_format=args.format, gpus=args.gpus)
    names["stock"] = add_python_contender(repo, names["fused"], f"{names['fused']}_stock", "stock_pipeline_model.py",
                                          with_graph=True)
    names["echo"] = add_python_contender(repo, names["fused"], f"{names['fused']}_echo", "zeros_python_model.py",
                                         with_graph=False)
    stub_models = {role: [model] for role, model in names.items()}
    stub_models["ensemble"] = step_models(repo, names["ensemble"])
    requests = example.requests(256)
    data = write_input_data(work / f"{name}-inputs.json", [{k: v[0] for k, v in r.items()} for r in requests])
    # Generating (profiling, exporting) and the pipeline measured before load the machine for a
    # minute after they end: measuring starts once the load average has settled.
    load_at_start = wait_until_quiet(log=lambda line: print(f"  {line}", flush=True))
    print(f"  load average at start: {load_at_start:.2f}", flush=True)
    points = {role: {level: [] for level in levels} for role in names}
    cpu_us = {role: {level: [] for level in levels} for role in names}
    decomposed = []
    with TritonServer(repo, log_path=work / f"{name}-tritonserver.log") as server:
        rounds_done = 0
        for round_ in rounds_within(args.rounds, args.budget_s):
            rounds_done += 1
            order = list(ROLES[round_ % 3:] + ROLES[:round_ % 3])
            for role in order + ["echo"]:
                for level in (levels if role != "echo" else [top]):
                    model = names[role]
                    decompose = args.decompose and role == "fused" and level == top
                    before = step_counters(server.metrics_url, model) if decompose else None
                    print(f"  round {round_ + 1}/{args.rounds}: {model} at concurrency {level} ...", flush=True)
                    stubs = [pid for m in stub_models[role] for pid in cpu.model_stub_pids(server.process.pid, m)]
                    point, used = measure_served(server, model, stubs, level, data, args.measurement_ms)
                    points[role][level].append(point)
                    cpu_us[role][level].append(used["total"])
                    if decompose:
                        time.sleep(1.2)  # latte publishes its counters once a second
                        after = step_counters(server.metrics_url, model)
                        count = max(1.0, after.get("requests", 0) - before.get("requests", 0))
                        calls = max(1.0, after.get("calls", 0) - before.get("calls", 0))
                        figures = {step: (after[step] - before.get(step, 0.0)) / count
                                   for step in after if step not in ("requests", "calls")}
                        figures["requests_per_execute"] = count / calls
                        decomposed.append(figures)
    limit = in_process_rate(work / name / "files", name, requests)

    def summary(role, level, field):
        return median([getattr(p, field) for p in points[role][level]])

    result = {"pipeline": name, "load_average_at_start": load_at_start, "slo_ms": SLO_MS, "levels": levels,
              "rounds": rounds_done, "models": names, "in_process": limit, "variant": results_variant(args),
              **level_figures(points, cpu_us)}
    for role in ROLES:
        best = best_level(levels, SLO_MS, lambda level: summary(role, level, "p99_ms"),
                          lambda level: summary(role, level, "throughput"))
        result[role] = {"throughput": summary(role, best, "throughput") if best else 0.0, "concurrency": best,
                        "p99_ms": summary(role, best, "p99_ms") if best else None,
                        "p50_ms_lowest_level": summary(role, levels[0], "p50_ms")}
    echo = summary("echo", top, "throughput")
    limit_h = 1.0 / (1.0 / echo + 1.0 / limit)
    fused = result["fused"]
    result.update(echo=echo, limit_h=limit_h, fused_share_of_h=fused["throughput"] / limit_h,
                  round_ratios={other: [a.throughput / max(1e-9, b.throughput)
                                        for a, b in zip(points["fused"][top], points[other][top])]
                                for other in ("ensemble", "stock")})
    # The same ratios level by level (the concurrency 16 among them), medians of the rounds.
    result["ratios_by_level"] = {
        other: {str(level): summary("fused", level, "throughput") / max(1e-9, summary(other, level, "throughput"))
                for level in levels} for other in ("ensemble", "stock")}
    for other in ("ensemble", "stock"):
        base = result[other]["throughput"]
        result[f"fused_vs_{other}"] = fused["throughput"] / base if base > 0 else None
        result[f"p50_fused_vs_{other}_lowest_level"] = (fused["p50_ms_lowest_level"]
                                                        / max(1e-9, result[other]["p50_ms_lowest_level"]))
    result["cpu_us_median"] = {role: {str(level): median(values) for level, values in by_level.items() if values}
                               for role, by_level in cpu_us.items()}
    if decomposed:
        result["decompose_us_per_request"] = {step: median([d[step] for d in decomposed]) for step in decomposed[0]}
        result["decompose_us_per_request"]["fused_wall"] = 1e6 / max(1e-9, summary("fused", top, "throughput"))
    return result


def print_results(results: List[dict]) -> None:
    print(f"\n{'pipeline':10} {'fused':>7} {'ensemble':>8} {'stock':>7} {'f/ens':>6} {'f/stock':>7} {'echo':>6} "
          f"{'in-proc':>8} {'H':>6} {'f/H':>5}   {'P99 ms fused/ens/stock':>24}   P50 at lowest level, fused/ensemble")
    for r in results:
        def ratio(key):
            return f"{r[key]:.2f}x" if r[key] is not None else "-"
        p99 = " / ".join(f"{r[role]['p99_ms']:.1f}" if r[role]["p99_ms"] is not None else "-" for role in ROLES)
        print(f"{r['pipeline']:10} {r['fused']['throughput']:>7.0f} {r['ensemble']['throughput']:>8.0f} "
              f"{r['stock']['throughput']:>7.0f} {ratio('fused_vs_ensemble'):>6} {ratio('fused_vs_stock'):>7} "
              f"{r['echo']:>6.0f} {r['in_process']:>8.0f} {r['limit_h']:>6.0f} {r['fused_share_of_h']:>5.0%}   "
              f"{p99:>24}   {r['fused']['p50_ms_lowest_level']:.2f} / {r['ensemble']['p50_ms_lowest_level']:.2f} ms "
              f"({r['p50_fused_vs_ensemble_lowest_level']:.2f}x)")
    print("(infer/s at the best level with P99 within the 50 ms SLO, medians of the rounds; H = 1/(1/echo + "
          "1/in-process))")
    for r in results:
        by_level = "; ".join(f"{other} " + ", ".join(f"{ratio:.2f}x at {level}" for level, ratio in ratios.items())
                             for other, ratios in r["ratios_by_level"].items())
        print(f"  {r['pipeline']}: fused / {by_level}")
        rounds = ", ".join(f"{x:.2f}" for x in r["round_ratios"]["ensemble"])
        print(f"  {r['pipeline']}: fused/ensemble each round at the top level: {rounds}; CPU us per request at the "
              "top level: " + ", ".join(f"{role} {r['cpu_us_median'][role][str(max(r['levels']))]:.0f}"
                                        for role in (*ROLES, "echo")))
        if "decompose_us_per_request" in r:
            d = r["decompose_us_per_request"]
            steps = ", ".join(f"{step} {us:.1f}" for step, us in d.items()
                              if step not in ("fused_wall", "requests_per_execute"))
            print(f"  {r['pipeline']}: us per request in each step: {steps} (of {d['fused_wall']:.0f} us wall; "
                  f"{d['requests_per_execute']:.1f} requests per execute call)")


TARGET_VS_ENSEMBLE = 1.6     # at concurrency 16
TARGET_SHARE_OF_H = 0.75
TARGET_P50_VS_ENSEMBLE = 0.75
TARGET_VS_STOCK = 1.1
TARGET_VS_ENSEMBLE_ON_GPU = 2.0   # at each one's best level, intermediates kept on the device


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _verdict(values, ok) -> str:
    passed = [v is not None and ok(v) for v in values]
    return "yes" if all(passed) else ("partly" if any(passed) else "no")


def summarize(results: List[dict]) -> dict:
    """What the page shows of a run: the targets, the tables, the throughput-P99 curves."""
    def best(r, role):
        b = r[role]
        return f"{b['throughput']:,.0f} (c {b['concurrency']}, P99 {b['p99_ms']:.1f} ms)" if b["concurrency"] else "-"

    main_rows = [[r["pipeline"], best(r, "fused"), best(r, "ensemble"), best(r, "stock"), _x(r["fused_vs_ensemble"]),
                  _x(r["fused_vs_stock"]), f"{r['limit_h']:,.0f}", f"{r['fused_share_of_h']:.0%}",
                  f"{r['fused']['p50_ms_lowest_level']:.3f} / {r['ensemble']['p50_ms_lowest_level']:.3f} ms "
                  f"({r['p50_fused_vs_ensemble_lowest_level']:.2f}x)"] for r in results]
    levels = results[0]["levels"]
    level_rows = [[r["pipeline"]] + [", ".join(_x(r["ratios_by_level"][other][str(level)]) for level in levels)
                                     for other in ("ensemble", "stock")]
                  + [", ".join(f"{x:.2f}" for x in r["round_ratios"]["stock"])] for r in results]
    top = str(max(levels))
    cpu_rows = [[r["pipeline"]] + [f"{r['cpu_us_median'][role][top]:.0f}" for role in (*ROLES, "echo")]
                for r in results]
    at16 = [r["ratios_by_level"]["ensemble"].get("16") for r in results]
    names = ", ".join(r["pipeline"] for r in results)
    targets = [
        Target(f"fused ≥ {TARGET_VS_ENSEMBLE}x Triton's ensemble at concurrency 16 (P99 ≤ {SLO_MS:.0f} ms)",
               ", ".join(f"{r['pipeline']} {_x(x)}" for r, x in zip(results, at16)),
               _verdict(at16, lambda v: v >= TARGET_VS_ENSEMBLE)),
        Target(f"fused ≥ {TARGET_SHARE_OF_H:.0%} of the one-hop bound H",
               ", ".join(f"{r['pipeline']} {r['fused_share_of_h']:.0%}" for r in results),
               _verdict([r["fused_share_of_h"] for r in results], lambda v: v >= TARGET_SHARE_OF_H)),
        Target(f"P50 at concurrency 1 ≤ {TARGET_P50_VS_ENSEMBLE}x the ensemble's",
               ", ".join(f"{r['pipeline']} {r['p50_fused_vs_ensemble_lowest_level']:.2f}x" for r in results),
               _verdict([r["p50_fused_vs_ensemble_lowest_level"] for r in results],
                        lambda v: v <= TARGET_P50_VS_ENSEMBLE)),
        Target(f"fused ≥ {TARGET_VS_STOCK}x a stock Python model running the same steps",
               ", ".join(f"{r['pipeline']} {r['fused_vs_stock']:.3f}x (median of round ratios "
                         f"{median(r['round_ratios']['stock']):.2f}x)" if r["fused_vs_stock"] else f"{r['pipeline']} -"
                         for r in results),
               _verdict([r["fused_vs_stock"] for r in results], lambda v: v >= TARGET_VS_STOCK),
               why="the serving cost both pay, not the steps, bounds it: see the CPU per request"),
    ]
    on_gpu = [r for r in results if r.get("variant", "").endswith("-gpu")]
    if on_gpu:
        targets.append(Target(
            f"on the GPU, fused ≥ {TARGET_VS_ENSEMBLE_ON_GPU:.0f}x its Triton ensemble at the best level "
            f"(P99 ≤ {SLO_MS:.0f} ms)",
            ", ".join(f"{r['pipeline']} {_x(r['fused_vs_ensemble'])} (rounds at {max(r['levels'])}: "
                      f"{', '.join(f'{x:.2f}' for x in r['round_ratios'].get('ensemble', []))})" for r in on_gpu),
            _verdict([r["fused_vs_ensemble"] for r in on_gpu], lambda v: v >= TARGET_VS_ENSEMBLE_ON_GPU)))
    charts = [Chart(name=f"pipeline-{r['pipeline']}{r.get('variant', '')}",
                    title=f"{r['pipeline']} pipeline: throughput against P99",
                    x_label="P99 latency (ms)", y_label="infer/s",
                    series=[Series({"fused": "fused (latte)", "ensemble": "Triton ensemble",
                                    "stock": "stock Python, steps by hand"}[role],
                                   p99_throughput_curve(r["points"][role], levels)) for role in ROLES],
                    x_line=r["slo_ms"], x_line_label=f"SLO {r['slo_ms']:.0f} ms") for r in results]
    return dict(
        summary=(f"Pipelines {names}: each served four ways in one tritonserver (fused by `latte generate`; "
                 "its `--no-fuse` Triton ensemble; a stock Python model running the same steps one request at "
                 "a time; an echo model computing nothing), perf_analyzer over gRPC, "
                 f"{results[0]['rounds']} interleaved rounds, medians. H = 1 / (1/echo + 1/in-process)."),
        targets=targets,
        tables=[Table(f"Best level with P99 ≤ {SLO_MS:.0f} ms (infer/s):",
                      ["pipeline", "fused", "ensemble", "stock", "fused / ensemble", "fused / stock", "H",
                       "fused / H", "P50 at concurrency 1, fused / ensemble"], main_rows),
                Table(f"Level by level ({', '.join(map(str, levels))} in flight), medians:",
                      ["pipeline", "fused / ensemble", "fused / stock", f"fused / stock each round at {top}"],
                      level_rows),
                Table(f"CPU per request at concurrency {top} (tritonserver + stubs + perf_analyzer, µs):",
                      ["pipeline", *ROLES, "echo"], cpu_rows)],
        charts=charts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", default="text,image,branching",
                        help=f"comma-separated, from {', '.join(PIPELINES)} (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--format", choices=("onnx", "torchscript"), default="onnx",
                        help="the files the pipelines' models are served from (torchscript: torch steps, which keep "
                             "a GPU's intermediates on it; the stock contender and H use the ONNX files on the CPU; "
                             "default: %(default)s)")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="stop before a round that would end past this many seconds of measuring a pipeline "
                             "(default: no budget)")
    parser.add_argument("--gpus", type=int, default=0,
                        help="the spec's resources: with GPUs, latte models are profiled and served on the first "
                             "(default: %(default)s)")
    parser.add_argument("--concurrency", default="1,16,64",
                        help="perf_analyzer concurrency levels; the best within the SLO counts (default: %(default)s)")
    parser.add_argument("--measurement-ms", type=int, default=2000, help="default: %(default)s")
    parser.add_argument("--decompose", action="store_true", help="also print each fused step's time per request")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where pipelines.json, the page's input, goes (default: %(default)s)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.pipeline.split(",") if n.strip()]
    unknown = [n for n in names if n not in PIPELINES]
    if unknown or args.rounds < 1:
        parser.error(f"unknown pipeline(s) {unknown}; choose from {', '.join(PIPELINES)}" if unknown
                     else "--rounds must be >= 1")
    variant = results_variant(args)
    started = new_results(f"pipelines{variant}", "gpu" if args.gpus else "pipelines",
                          "Fused pipelines against Triton's ensemble and the stock loop"
                          + (f" ({args.format} models" + (", on the GPU)" if args.gpus else ")") if variant else ""),
                          command_line("benchmarks/pipelines.py", argv), None, HERE)
    results = run_each(names, run_pipeline, args, "latte-pipelines-")
    print_results(results)
    started.load_at_start = cut_load(max(r["load_average_at_start"] for r in results))
    print(f"wrote {write_summary(started, summarize(results), args.results_dir, {'runs': results})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
