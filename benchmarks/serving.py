"""Serving benchmark: the latte backend vs Triton's stock Python backend on the same model.

    .venv/bin/python benchmarks/serving.py [--model identity,mlp,cnn,sequence,ranker]
                                           [--rounds 3] [--concurrency 1,16] [--decompose]
                                           [--out results.json] [--results-dir benchmarks/results]

Per model, one tritonserver serves three contenders behind the same `max_batch_size`,
`dynamic_batching` delay, one instance and one intra-op thread:

- latte: the model file with `backend: "latte"` and its defaults;
- stock: Triton's stock Python backend running the documented per-request loop over
  onnxruntime (for `identity`: a model.py that echoes its input, the least work any
  Python-backend model can do);
- echo: that echo model on the same input, the serving cost alone (client, gRPC, Triton's
  core, the Python stub), measured in every round.

perf_analyzer (gRPC) drives each with the same requests (ragged models: lengths drawn from
`--lengths`), rounds interleaved, contenders in alternating order; medians are reported.
The limit a Python-backend model can reach here is H = 1 / (1/echo + 1/in-process), where
in-process is the same ONNX file's best rows/s on one thread in padded batches (ragged
inputs length-sorted); latte / H says how close latte comes.

`--decompose` adds where latte's time goes per request, from its own counters
(latte_execute_us_total by stage, latte_model_duration_us_total) scraped around each
measurement, next to the echo model's whole per-request cost.

Every measurement also charges the CPU it used to the requests it served (latte.bench.cpu):
µs of CPU per request in the server process, in the contender's stub and in perf_analyzer.
Wall-clock throughput on this kind of box moves 15-25 % between rounds; CPU per request
moves far less, so `stock CPU / latte CPU` (above 1: latte costs the machine less per
request) settles what a throughput ratio within the noise cannot.

Each model's figures, summarised, replace benchmarks/results/serving-<model>.json, from which
docs/benchmarks.md is rendered (`.venv/bin/python -m latte.bench.page`).

Models: identity (ONNX Identity on FP32[64]: serving cost alone), mlp (16 -> 8), cnn
(3x32x32), sequence (token ids 1..128, lognormal lengths), ranker (item histories 1..64
into a 97 MB embedding bag + MLP tower; built on request, ~20 s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from latte.bench import cpu
from latte.bench.budget import rounds_within
from latte.bench.lengths import LengthDistribution
from latte.bench.prometheus_scrape import scrape, total
from latte.bench.quiet import wait_until_quiet
from latte.bench.results import Chart, Series, Table, Target, command_line, new_results, utc_now, write_summary
from latte.examples import (CATALOG, FORMATS, STOCK_PYTHON_MODEL, Example, ExampleTensor, build_examples,
                            write_served_copy)
from latte.generator.calibrate import write_identity_onnx
from latte.triton import TritonServer
from latte.bench.triton_stats import fetch_stats
from latte.triton.perf import PerfAnalyzerError, run_perf_analyzer, write_input_data

HERE = Path(__file__).resolve().parent
IDENTITY = Example("identity", "FP32[64] returned as it came (ONNX Identity)",
                   (ExampleTensor("INPUT0", "TYPE_FP32", (64,)),), (ExampleTensor("OUTPUT0", "TYPE_FP32", (64,)),),
                   max_batch_size=32)


# --ablation: latte with one setting changed at a time, measured like latte in every round.
ABLATIONS = {
    "scheduler_lane": {"scheduler": "affinity"},
    "bucket_planning": {"batch_planning": "bucket"},
    "respond_per_batch": {"respond": "per_batch"},
    "respond_per_call": {"respond": "per_call"},
    "async_execute": {"async_execute": "true"},
    # TorchScript served as loaded, not frozen (torch.jit.freeze at load is the default).
    "unfrozen": {"freeze": "false"},
}


@dataclass(frozen=True)
class Setting:
    slo_ms: float
    concurrency: str
    queue_delay_us: int
    max_batch_size: int
    lengths: Optional[str] = None


SETTINGS = {
    "identity": Setting(50.0, "1,16", 500, 32),
    "mlp": Setting(50.0, "1,16", 500, 32),
    "cnn": Setting(50.0, "1,16", 500, 32),
    "sequence": Setting(50.0, "1,16", 500, 32, "lognormal:median=24,sigma=0.8"),
    "ranker": Setting(100.0, "8,16,32,64,96,128", 2000, 64, "uniform:low=1,high=64"),
}


def model_file(example: Example, work: Path, runtime: str = "onnx") -> Path:
    """The example's ONNX or TorchScript file, built here."""
    if example.name == "identity":
        if runtime != "onnx":
            raise SystemExit("serving.py: the identity model is ONNX only")
        return write_identity_onnx(work / "identity" / "model.onnx")
    repo = build_examples(work / f"{example.name}-build-repo", names=[example.name])
    return repo / f"{example.name}_{runtime}" / "1" / FORMATS[runtime]


def add_contenders(repo: Path, example: Example, source: Path, setting: Setting, ablations: Sequence[str] = (),
                   kind: str = "KIND_CPU") -> Dict[str, str]:
    """latte, stock and echo copies of the model in `repo` (and latte's ablations); role -> model name.
    latte and stock run on `kind`'s instances; the echo, which computes nothing, on the CPU."""
    names = {}
    roles = [("latte", "latte", None),
             ("stock", "python", HERE / "echo_python_model.py" if example.name == "identity" else STOCK_PYTHON_MODEL),
             ("echo", "python", HERE / "echo_python_model.py")]
    roles += [(f"latte_{label}", "latte", None) for label in ablations]
    for role, backend, script in roles:
        config = dict(max_batch_size=setting.max_batch_size,
                      dynamic_batching={"max_queue_delay_microseconds": setting.queue_delay_us},
                      instance_groups=[{"count": 1, "kind": "KIND_CPU" if role == "echo" else kind}])
        if role == "echo":
            # The same request bytes, echoed: the first input comes back as the output.
            first = example.inputs[0]
            config["outputs"] = [{"name": "ECHO", "data_type": first.data_type, "dims": list(first.dims)}]
        names[role] = f"{example.name}_{role}"
        write_served_copy(repo, example, source, names[role], backend, script=script,
                          parameters=ABLATIONS.get(role[len("latte_"):]) if role.startswith("latte_") else None,
                          **config)
    return names


def samples_for(example: Example, setting: Setting, count: int = 256):
    rng = np.random.default_rng(5)
    if setting.lengths:
        lengths = LengthDistribution.parse(setting.lengths).sample(rng, count, example.max_sequence_length)
        return [{k: v[0] for k, v in example.sample(1, rng, length=int(n)).items()} for n in lengths]
    return [{k: v[0] for k, v in example.sample(1, rng).items()} for _ in range(count)]


def model_runner(source: Path, name: str, device: str = "cpu"):
    """One call of the model file on one thread: ONNX with onnxruntime, TorchScript with torch
    on `device` (answers copied back to the host, as a served model's are)."""
    if source.suffix == ".onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(source), sess_options=options, providers=["CPUExecutionProvider"])
        return lambda x: session.run(None, {name: x})
    import torch

    torch.set_num_threads(1)
    return torch_runner(torch.jit.load(str(source), map_location=device).eval(), device)


def torch_runner(module, device: str):
    """The stock Python model's call of a TorchScript module (its model.py's run): the request's
    array onto the device, the module, the answer back to the host."""
    import torch

    def run(x):
        with torch.inference_mode():
            return module(torch.from_numpy(x).to(device)).cpu().numpy()
    return run


def in_process_limit(source: Path, example: Example, samples, max_batch: int, seconds: float = 3.0,
                     device: str = "cpu"):
    """Best rows/s of the model file on one thread: (rate, batch). Ragged inputs are sorted by
    length within windows of 64 requests and padded per batch, the best a batcher can do."""
    name = example.inputs[0].name
    run = model_runner(source, name, device)
    rows = [s[name] for s in samples]
    if example.inputs[0].ragged:
        rows = [r for w in range(0, len(rows), 64) for r in sorted(rows[w:w + 64], key=len)]
    rates = {}
    for batch in sorted({b for b in (1, 8, 16, 32, 64) if b <= max_batch}):
        feeds = []
        for at in range(0, len(rows) - batch + 1, batch):
            group = rows[at:at + batch]
            longest = max(len(g) for g in group) if example.inputs[0].ragged else None
            if longest is None:
                feeds.append(np.stack(group))
            else:
                padded = np.zeros((batch, longest), group[0].dtype)
                for r, g in enumerate(group):
                    padded[r, :len(g)] = g
                feeds.append(padded)
        done, started, i = 0, time.perf_counter(), 0
        while time.perf_counter() - started < seconds / 5:
            run(feeds[i % len(feeds)])
            done += batch
            i += 1
        rates[batch] = done / (time.perf_counter() - started)
    best = max(rates, key=rates.get)
    return rates[best], best


def measure(model: str, url: str, level: int, data: Path, measurement_ms: int):
    """One concurrency level; a level that cannot settle within 30 % is measured again at 100 % and flagged."""
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


def measure_served(server, model: str, stubs: Sequence[int], level: int, data: Path, measurement_ms: int):
    """One level of `model` on `server` (measure), and the CPU time a request answered meanwhile
    cost the server and the processes `stubs` (cpu.per_request_us)."""
    served_before = fetch_stats(server.http_url, model).success_count
    cpu_before = cpu.sample(server.process.pid, stubs)
    point = measure(model, server.grpc_url, level, data, measurement_ms)
    used = cpu.sample(server.process.pid, stubs).minus(cpu_before)
    served = fetch_stats(server.http_url, model).success_count - served_before
    return point, cpu.per_request_us(used, served)


def level_figures(points: Dict[str, Dict[int, list]], cpu: Dict[str, Dict[int, list]]) -> Dict[str, dict]:
    """Each contender's points and CPU a request at each level, by round, as the results keep them."""
    return {"points": {role: {str(level): [p.as_dict() for p in ps] for level, ps in by_level.items()}
                       for role, by_level in points.items()},
            "cpu_us_per_request": {role: {str(level): ps for level, ps in by_level.items()}
                                   for role, by_level in cpu.items()}}


def best_level(levels: Sequence[int], slo_ms: float, p99_ms, throughput) -> Optional[int]:
    """The level of most throughput (`throughput(level)`) among those whose P99 (`p99_ms(level)`,
    None where not measured) is within slo_ms; None where none is."""
    ok = [level for level in levels if (p99_ms(level) or 1e9) <= slo_ms]
    return max(ok, key=throughput) if ok else None


STAGES = ("read", "engine", "respond")


def latte_counters(metrics_url: str, model: str) -> Dict[str, float]:
    for attempt in range(20):  # the metrics port opens a moment after the server is ready
        try:
            values = scrape(metrics_url)
            break
        except OSError:
            if attempt == 19:
                raise
            time.sleep(0.25)
    found = {stage: total(values, "latte_execute_us_total", model=model, stage=stage) or 0.0 for stage in STAGES}
    found["model"] = total(values, "latte_model_duration_us_total", model=model) or 0.0
    found["requests"] = total(values, "latte_execute_requests_total", model=model) or 0.0
    found["calls"] = total(values, "latte_execute_calls_total", model=model) or 0.0
    return found


def per_request(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    """µs per request of each stage between two scrapes (the model's own time split out of
    the engine's), and requests per execute call."""
    requests = max(1.0, after["requests"] - before["requests"])
    out = {k: (after[k] - before[k]) / requests for k in (*STAGES, "model")}
    out["engine"] -= out["model"]
    out["requests_per_execute"] = requests / max(1.0, after["calls"] - before["calls"])
    return out


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def p99_throughput_curve(points_by_level: dict, levels) -> list:
    """(P99 ms, infer/s) at each level, medians of the rounds: the curve the page draws."""
    return [(round(median([p["p99_ms"] for p in points_by_level[str(level)]]), 3),
             round(median([p["throughput"] for p in points_by_level[str(level)]]), 1)) for level in levels]


def run_model(name: str, args, work: Path) -> dict:
    # The model before loads the machine for a minute after its server stops.
    load_at_start = wait_until_quiet(log=lambda line: print(f"  {line}", flush=True))
    print(f"  load average at start: {load_at_start:.2f}", flush=True)
    started = utc_now()
    example = IDENTITY if name == "identity" else CATALOG[name]
    setting = SETTINGS[name]
    levels = [int(x) for x in (args.concurrency or setting.concurrency).split(",")]
    source = model_file(example, work, args.runtime)
    repo = work / f"{name}-repo"
    names = add_contenders(repo, example, source, setting, args.ablation, args.kind)
    samples = samples_for(example, setting)
    data = write_input_data(work / f"{name}-inputs.json", samples)
    points: Dict[str, Dict[int, list]] = {role: {level: [] for level in levels} for role in names}
    cpu_points: Dict[str, Dict[int, List[Dict[str, float]]]] = {role: {level: [] for level in levels} for role in names}
    decomposed: List[dict] = []
    top = max(levels)
    extra = [f"--backend-config={value}" for value in args.backend_config]
    rounds_done = 0
    with TritonServer(repo, log_path=work / f"{name}-tritonserver.log", extra_args=extra) as server:
        for round_ in rounds_within(args.rounds, args.budget_s):
            rounds_done += 1
            order = ["latte", "stock"] if round_ % 2 == 0 else ["stock", "latte"]
            ablations = [role for role in names if role.startswith("latte_")]
            for role in order + ablations + ["echo"]:
                for level in (levels if role != "echo" else [top]):
                    decompose = args.decompose and role == "latte" and level == top
                    before = latte_counters(server.metrics_url, names["latte"]) if decompose else None
                    print(f"  round {round_ + 1}/{args.rounds}: {names[role]} at concurrency {level} ...", flush=True)
                    stubs = cpu.model_stub_pids(server.process.pid, names[role])
                    point, used = measure_served(server, names[role], stubs, level, data, args.measurement_ms)
                    points[role][level].append(point)
                    cpu_points[role][level].append(used)
                    if decompose:
                        time.sleep(1.2)  # latte publishes its counters once a second
                        decomposed.append(per_request(before, latte_counters(server.metrics_url, names["latte"])))
    limit, limit_batch = in_process_limit(source, example, samples, setting.max_batch_size,
                                          device="cuda" if args.kind == "KIND_GPU" else "cpu")

    def summary(role, level, field):
        return median([getattr(p, field) for p in points[role][level]])

    result = {"model": name, "runtime": args.runtime, "kind": args.kind, "started": started, "load_average_at_start": load_at_start, "slo_ms": setting.slo_ms, "levels": levels,
              "rounds": rounds_done,
              "in_process_limit": limit, "in_process_batch": limit_batch, **level_figures(points, cpu_points)}
    for role in names:
        if role == "echo":
            continue
        best = best_level(levels, setting.slo_ms, lambda level: summary(role, level, "p99_ms"),
                          lambda level: summary(role, level, "throughput"))
        figures = {"throughput": summary(role, best, "throughput") if best else 0.0, "concurrency": best,
                   "p50_ms": summary(role, best, "p50_ms") if best else None,
                   "p99_ms": summary(role, best, "p99_ms") if best else None,
                   "p50_ms_lowest_level": summary(role, levels[0], "p50_ms")}
        if role.startswith("latte_"):
            result.setdefault("ablations", {})[role[len("latte_"):]] = figures
        else:
            result[role] = figures
    # Each round's two contenders ran minutes apart at most: their ratio drifts less with the
    # machine than the ratio of separate medians does.
    round_ratios = [a.throughput / max(1e-9, b.throughput) for a, b in zip(points["latte"][top], points["stock"][top])]
    result["round_ratios_top_level"] = round_ratios
    # CPU per request, stock over latte (above 1: latte costs the machine less), each round's
    # pair and their median, at every level; and each contender's median split by process.
    result["cpu_ratios"] = {}
    for level in levels:
        pairs = [b["total"] / max(1e-9, a["total"]) for a, b in zip(cpu_points["latte"][level], cpu_points["stock"][level])]
        result["cpu_ratios"][str(level)] = {"rounds": pairs, "median": statistics.median(pairs)}
    result["cpu_us_median"] = {
        role: {str(level): {k: median([c[k] for c in cs]) for k in ("server", "stub", "client", "total")}
               for level, cs in by_level.items() if cs}
        for role, by_level in cpu_points.items()}
    result["round_ratio_median"] = statistics.median(round_ratios)
    echo = summary("echo", top, "throughput")
    limit_h = 1.0 / (1.0 / echo + 1.0 / limit)
    result.update(echo=echo, python_backend_limit=limit_h,
                  # None where no level of the stock contender kept its P99 within the SLO
                  ratio=(result["latte"]["throughput"] / result["stock"]["throughput"]
                         if result["stock"]["throughput"] > 0 else None),
                  latte_share_of_limit=result["latte"]["throughput"] / limit_h,
                  stock_share_of_limit=result["stock"]["throughput"] / limit_h,
                  p50_ratio_lowest_level=(result["latte"]["p50_ms_lowest_level"]
                                          / max(1e-9, result["stock"]["p50_ms_lowest_level"])))
    if decomposed:
        result["decompose_us_per_request"] = {k: median([d[k] for d in decomposed]) for k in decomposed[0]}
        result["decompose_us_per_request"]["echo_wall"] = 1e6 / echo
        result["decompose_us_per_request"]["latte_wall"] = 1e6 / max(1e-9, summary("latte", top, "throughput"))
    return result


def print_results(results: List[dict]) -> None:
    print(f"\n{'model':9} {'latte':>8} {'stock':>8} {'ratio':>6} {'rounds':>6} {'echo':>7} {'in-proc':>8} {'H':>7} "
          f"{'latte/H':>7} {'stock/H':>7} {'P50 at lowest level, latte/stock':>34}")
    for r in results:
        low = f"{r['latte']['p50_ms_lowest_level']:.2f} / {r['stock']['p50_ms_lowest_level']:.2f} ms " \
              f"({r['p50_ratio_lowest_level']:.2f}x)"
        ratio = f"{r['ratio']:>5.2f}x" if r["ratio"] is not None else f"{'-':>6}"
        print(f"{r['model']:9} {r['latte']['throughput']:>8.0f} {r['stock']['throughput']:>8.0f} {ratio} "
              f"{r['round_ratio_median']:>5.2f}x "
              f"{r['echo']:>7.0f} {r['in_process_limit']:>8.0f} {r['python_backend_limit']:>7.0f} "
              f"{r['latte_share_of_limit']:>7.0%} {r['stock_share_of_limit']:>7.0%} {low:>34}")
    print("(infer/s at the best level with P99 within the SLO, medians of the rounds; rounds: the median of each "
          "round's latte/stock ratio at the top level; H = 1/(1/echo + 1/in-process); ratio '-': no stock level "
          "within the SLO)")
    for r in results:
        for label, figures in r.get("ablations", {}).items():
            defaults = r["latte"]["throughput"]
            relative = f"{figures['throughput'] / defaults:.2f}x" if defaults > 0 else "-"
            low = r["latte"]["p50_ms_lowest_level"]
            p50 = (f", P50 at level {r['levels'][0]} {figures['p50_ms_lowest_level']:.2f} ms against "
                   f"{low:.2f}" if low else "")
            print(f"  {r['model']} ablation {label:18} {figures['throughput']:>8.0f} infer/s ({relative} latte's "
                  f"defaults{p50})")
    print(f"\n{'model':9} {'level':>5} {'latte CPU us/req (server+stub+client)':>40} "
          f"{'stock CPU us/req':>30} {'stock/latte':>11} {'rounds':>18}")
    for r in results:
        for level in r["levels"]:
            key = str(level)
            if key not in r["cpu_ratios"]:
                continue
            ratio = r["cpu_ratios"][key]

            def parts(role):
                c = r["cpu_us_median"][role][key]
                return f"{c['total']:.0f} ({c['server']:.0f}+{c['stub']:.0f}+{c['client']:.0f})"
            rounds = ", ".join(f"{x:.2f}" for x in ratio["rounds"])
            print(f"{r['model']:9} {level:>5} {parts('latte'):>40} {parts('stock'):>30} {ratio['median']:>10.2f}x "
                  f"{rounds:>18}")
    print("(CPU per request in tritonserver + the contender's stub + perf_analyzer, medians of the rounds; "
          "stock/latte above 1: latte costs the machine less per request)")
    decomposed = [r for r in results if "decompose_us_per_request" in r]
    if decomposed:
        print(f"\n{'model':9} {'req/exec':>8} {'read':>6} {'engine':>7} {'model':>6} {'respond':>8} "
              f"{'latte wall':>10} {'echo wall':>10}   (us per request at the top level)")
        for r in decomposed:
            d = r["decompose_us_per_request"]
            print(f"{r['model']:9} {d['requests_per_execute']:>8.1f} {d['read']:>6.1f} {d['engine']:>7.1f} "
                  f"{d['model']:>6.1f} {d['respond']:>8.1f} {d['latte_wall']:>10.1f} {d['echo_wall']:>10.1f}")


def variant_suffix(r: dict) -> str:
    """'' for the default (ONNX on CPU instances), else '-torchscript-gpu' and the like."""
    runtime, kind = r.get("runtime", "onnx"), r.get("kind", "KIND_CPU")
    return "" if (runtime, kind) == ("onnx", "KIND_CPU") else f"-{runtime}-{kind.split('_')[1].lower()}"


def variant_label(r: dict) -> str:
    return f" ({r['runtime']}, {r['kind']})" if variant_suffix(r) else ""


# What latte is held to against the stock loop, per model (the rest: never slower).
TARGET_RATIO = {"ranker": 6.0, "sequence": 1.2}
# On a GPU (issue targets for KIND_GPU instances against the stock loop on the same GPU).
TARGET_RATIO_GPU = {"ranker": 3.0, "sequence": 1.5}
TARGET_SHARE = 0.80
TARGET_P50 = 1.10


def summarize(r: dict) -> dict:
    """What the page shows of one model's run: the targets, the contenders' table, CPU per
    request, and the throughput-P99 curves."""
    model, slo, levels, top = r["model"], r["slo_ms"], r["levels"], str(max(r["levels"]))
    stock_label = "echo (stock)" if model == "identity" else "stock"
    on_gpu = r.get("kind") == "KIND_GPU"
    targets_by_model = TARGET_RATIO_GPU if on_gpu else TARGET_RATIO
    wanted = targets_by_model.get(model, 1.0)
    ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
    # The ranker's bound is the model on one thread; the others' is the Python backend (H).
    # On the CPU the ranker's bound is the model on one thread; on a GPU, as for the others, the
    # Python backend (H): the model runs far faster than one hop is served.
    share_name, share = (("the in-process limit", r["latte"]["throughput"] / r["in_process_limit"])
                         if model == "ranker" and not on_gpu else ("H", r["latte_share_of_limit"]))
    server_us = r["cpu_us_median"]["latte"][top]["server"]
    targets = [Target(f"{model}: latte ≥ {wanted:.1f}x the {stock_label} loop at P99 ≤ {slo:.0f} ms (median of "
                      "round ratios)", f"{r['round_ratio_median']:.2f}x (ratio of medians {ratio})",
                      "yes" if r["round_ratio_median"] >= wanted else "no",
                      why=f"the {stock_label} loop already serves {r['stock_share_of_limit']:.0%} of H: the serving "
                          "cost both pay bounds the gap"),
               Target(f"{model}: P50 at concurrency {levels[0]} within {TARGET_P50 - 1:.0%} of the {stock_label} "
                      "loop's", f"{r['p50_ratio_lowest_level']:.2f}x",
                      "yes" if r["p50_ratio_lowest_level"] <= TARGET_P50 else "no",
                      why="with one request a call, latte pays its planning and metrics with nothing to batch")]
    if model in targets_by_model:
        targets.append(Target(f"{model}: latte ≥ {TARGET_SHARE:.0%} of {share_name}", f"{share:.0%}",
                              "yes" if share >= TARGET_SHARE else "no",
                              why=(f"tritonserver's {server_us:.0f} µs of CPU a request (copying a call's inputs "
                                   "and responses) runs serially with the model on one instance"
                                   if share_name != "H" else
                                   f"the echo alone serves {r['echo']:,.0f} infer/s: the serving cost is most of H")))

    def row(role, label):
        b = r[role]
        rounds = " / ".join(f"{p['throughput']:,.0f}" for p in r["points"][role][top])
        return [label, f"{b['throughput']:,.0f}" if b["concurrency"] else "- (no level within the SLO)",
                str(b["concurrency"] or "-"), f"{b['p99_ms']:.1f}" if b["p99_ms"] else "-", rounds]
    rows = [row("latte", "latte"), row("stock", stock_label),
            ["echo (the serving cost alone)", f"{r['echo']:,.0f}", top, "", ""],
            [f"in-process limit (1 thread, batch {r['in_process_batch']})", f"{r['in_process_limit']:,.0f} rows/s",
             "", "", ""],
            ["H = 1 / (1/echo + 1/in-process)", f"{r['python_backend_limit']:,.0f}", "", "", ""]]
    cpu_rows = [[role] + [f"{r['cpu_us_median'][role][top][k]:.0f}" for k in ("server", "stub", "client", "total")]
                for role in ("latte", "stock")]
    curves = [Series(label, p99_throughput_curve(r["points"][role], levels))
              for role, label in (("latte", "latte"), ("stock", stock_label))]
    return dict(
        summary=(f"`{model}`: latte / {stock_label} **{ratio}** at the best level with P99 ≤ {slo:.0f} ms (median "
                 f"of round ratios at concurrency {top}: {r['round_ratio_median']:.2f}x); latte at {share:.0%} of "
                 f"{share_name}; P50 at concurrency {levels[0]} {r['p50_ratio_lowest_level']:.2f}x the "
                 f"{stock_label} loop's. One tritonserver, one instance and one intra-op thread each, perf_analyzer "
                 f"over gRPC at concurrency {', '.join(map(str, levels))}, {r['rounds']} interleaved rounds, medians."),
        targets=targets,
        tables=[Table(f"Best level with P99 ≤ {slo:.0f} ms (infer/s; rounds: each round at concurrency {top}):",
                      ["contender", "infer/s", "at concurrency", "P99 ms", "rounds"], rows),
                Table(f"CPU per request at concurrency {top} (µs, medians of the rounds; stock / latte "
                      f"{r['cpu_ratios'][top]['median']:.2f}x):", ["contender", "tritonserver", "stub",
                                                                   "perf_analyzer", "total"], cpu_rows)],
        charts=[Chart(f"serving-{model}{variant_suffix(r)}", f"{model}{variant_label(r)}: throughput against P99", "P99 latency (ms)", "infer/s", curves,
                      x_line=slo, x_line_label=f"SLO {slo:.0f} ms")] if len(levels) > 1 else [])


def ablation_names(text: str) -> List[str]:
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in ABLATIONS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown ablation {', '.join(unknown)}; known: {', '.join(ABLATIONS)}")
    return names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="identity,sequence,mlp",
                        help=f"comma-separated, from {', '.join(SETTINGS)} (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--concurrency", help="perf_analyzer concurrency levels, comma-separated (default: per model)")
    parser.add_argument("--measurement-ms", type=int, default=2000, help="default: %(default)s")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="seconds of measuring per model: rounds after the first stop where another would pass "
                             "it (default: no budget)")
    parser.add_argument("--decompose", action="store_true", help="also print where latte's time goes per request")
    parser.add_argument("--ablation", nargs="?", const=",".join(ABLATIONS), default="", type=ablation_names,
                        help=f"also measure latte with one setting changed at a time: all of them ({', '.join(ABLATIONS)}), "
                             "or those named, comma-separated")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where serving-<model>.json, the page's input, goes (default: %(default)s)")
    parser.add_argument("--runtime", choices=("onnx", "torchscript"), default="onnx",
                        help="the model file latte and the stock model serve (default: %(default)s)")
    parser.add_argument("--kind", choices=("KIND_CPU", "KIND_GPU"), default="KIND_CPU",
                        help="latte's and the stock model's instances; KIND_GPU needs --runtime torchscript "
                             "(default: %(default)s)")
    parser.add_argument("--backend-config", action="append", default=[], metavar="BACKEND,KEY=VALUE",
                        help="passed to tritonserver as --backend-config, e.g. python,shm-default-byte-size=16777216 "
                             "(repeatable; applies to every contender)")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    unknown = [m for m in models if m not in SETTINGS]
    if unknown or args.rounds < 1:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(SETTINGS)}" if unknown
                     else "--rounds must be >= 1")
    if args.kind == "KIND_GPU" and args.runtime != "torchscript":
        parser.error("--kind KIND_GPU serves TorchScript: add --runtime torchscript (onnxruntime runs on the CPU here)")
    command = command_line("benchmarks/serving.py", argv)
    results = run_each(models, run_model, args, "latte-serving-")
    print_results(results)
    for r in results:
        # The default (ONNX on CPU instances) keeps its plain name; other settings are their own results.
        record = new_results(f"serving-{r['model']}{variant_suffix(r)}", "gpu" if args.kind == "KIND_GPU" else "serving",
                             f"Serving {r['model']}{variant_label(r)}: latte against the stock Python backend",
                             command, r["load_average_at_start"], HERE, r["started"])
        print(f"wrote {write_summary(record, summarize(r), args.results_dir, r)}")
    return 0


def run_each(names: Sequence[str], run, args, prefix: str) -> List[dict]:
    """run(name, args, work) for each name in one work folder; the figures so far are written to
    --out after each, so a long run that stops keeps what it measured."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    results = []
    for name in names:
        print(f"{name}:", flush=True)
        results.append(run(name, args, work))
        if args.out:
            args.out.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    sys.exit(main())
