"""latte's derived and tuned configs vs Triton Model Analyzer's quick and brute searches.

For each case (example model x P99 SLO):

- latte derived: `latte profile` (in process) with this machine's serving cost, then the
  derivation; wall time = profile + whatever the calibration cost in this run: nothing when
  the machine's calibration is kept from an earlier run (it is taken once per machine and
  kept a week, see latte.generator.calibrate), ~20 s when it is measured. The table prints
  which; --recalibrate measures it afresh.
- latte tuned: `latte tune` from the derived config; wall time = derived + tune.
- MA quick / MA brute: Triton Model Analyzer (installed by this script in its own venv,
  MODEL_ANALYZER_VENV, because its pins differ from latte's) in remote mode against a
  tritonserver in explicit model-control mode with the model loaded at start, `cpu_only`,
  constraint P99 <= SLO, objective throughput; its best config under the constraint.
- Triton default: the same model with an empty dynamic_batching and one instance.

Then every config is served side by side by one tritonserver and driven by perf_analyzer
in closed loop with lognormal sequence lengths, concurrency doubling from 2 until P99 passes
the SLO or throughput stops growing (up to 512 in flight; `latte tune` scans the same way).
A config's score in one round is its best throughput among the levels whose P99 stays within
the SLO (beside it: the same up to 32 in flight, where a loose SLO does not bind and only
throughput is compared); its result is the median over --rounds interleaved rounds (the
order flips each round).

    .venv/bin/python benchmarks/generator.py                        # every case, 3 rounds
    .venv/bin/python benchmarks/generator.py --cases sequence:30 --rounds 1 --quick --skip-model-analyzer
    .venv/bin/python benchmarks/generator.py --cases ranker:100 --model-analyzer-searches brute --tune-budget-s 150
    .venv/bin/python benchmarks/generator.py --cases ranker:100 --model-analyzer-searches brute --model-analyzer-from .latte/bench-generator --out .latte/bench-generator-again

With --model-analyzer-from, Model Analyzer's picks and wall times come from an earlier run's
--out directory (the same cases and searches) and are served again in this run's rounds:
latte changed, measured against the same pick without another half hour of searching.

Targets: derived >= 1.0x MA quick at <= 5 % of its wall time; tuned >= 1.05x MA brute at
<= 10 % of its wall time. Figures belong to a quiet machine; --quick is a smoke run only.
Each case's summary replaces benchmarks/results/generator-<model>-<slo>.json, from which
docs/benchmarks.md is rendered (`.venv/bin/python -m latte.bench.page`).
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from latte.bench.quiet import wait_until_quiet
from latte.bench.results import Chart, Series, Table, Target, command_line, new_results, write_summary

CASES = ["sequence:10", "sequence:30", "ranker:100"]
# Closed-loop requests in flight: doubling from the first to the last, until P99 passes the SLO.
LEVELS = [2, 512]
QUICK_LEVELS = [2, 8]
# The figure up to 32 in flight is kept beside it: where the SLO does not bind there, it
# measures throughput alone (the first head-to-head's levels, 2..32).
NARROW_LEVEL = 32
ROUNDS = 3
MEASUREMENT_MS = 2000
MODEL_ANALYZER = "triton-model-analyzer"
MODEL_ANALYZER_VENV = Path(".latte/model-analyzer-venv")
# Lognormal sequence lengths: median LENGTH_MEDIAN tokens, long tail, clipped to the model's maximum.
LENGTH_MEDIAN, LENGTH_SIGMA, SAMPLES = 16, 0.8, 64
CONFIGS = ["derived", "tuned", "ma_quick", "ma_brute", "default"]


def lognormal_samples(config, max_length: int, seed: int = 0) -> List[dict]:
    from latte.generator.verify import input_samples

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(LENGTH_MEDIAN), LENGTH_SIGMA, SAMPLES).astype(int), 1, max_length)
    return [input_samples(config, int(n), count=1, seed=i)[0] for i, n in enumerate(lengths)]


# ---- latte: derive and tune -------------------------------------------------------------------

def latte_configs(example: str, slo_ms: float, work: Path, install, cost, cost_s: float, quick: bool,
                  tune_budget_s: Optional[float] = None) -> dict:
    """Derived and tuned config contexts plus their wall times."""
    from latte.bench.lengths import LengthDistribution
    from latte.examples import CATALOG, export
    from latte.generator.derive import derive
    from latte.generator.generate import plan_latte_model
    from latte.generator.operating_point import OperatingPoint, write_operating_points
    from latte.generator.profile import ProfileOptions, profile_model
    from latte.backend.config import usable_cores
    from latte.generator.model_folder import write_model
    from latte.generator.spec import ModelEntry, PipelineSpec
    from latte.generator.tune import tune
    from latte.generator.validate import parse_config
    from latte.generator.yaml_lines import Located

    model_file = export(CATALOG[example], work / "export" / example)["onnx"]
    started = time.perf_counter()
    options = ProfileOptions(max_length=CATALOG[example].max_sequence_length or None, slo_ms=slo_ms)
    if quick:
        options.min_seconds, options.max_batch_size = 0.05, 32
    profile = profile_model(model_file, options)
    profile.serving = cost
    derived_s = time.perf_counter() - started + cost_s
    cores = usable_cores()
    spec = PipelineSpec(Located("benchmark", {}, {}), work, [], [], cores, 0)
    entry = ModelEntry(name="m", backend="latte", file=model_file, path=(), runtime="onnx", slo_ms=slo_ms)
    plan = plan_latte_model(spec, entry, profile)
    derivation = derive(profile, slo_ms, cores=cores)

    repo = work / "tune_repo"
    shutil.rmtree(repo, ignore_errors=True)
    write_model(repo, {**plan.context, "warmup": []}, {plan.context["parameters"]["model_file"]: model_file})
    profile.save(work / "m.json")
    write_operating_points(repo, {"m": OperatingPoint(slo_ms, derivation.planned_rate, "derived",
                                                      str(work / "m.json"))})
    # The tuner measures the lengths the rounds will serve, not one length.
    lengths = LengthDistribution.parse(f"lognormal:median={LENGTH_MEDIAN},sigma={LENGTH_SIGMA}")
    result = tune(repo, "m", slo_ms, install=install, measurement_ms=500 if quick else 1000,
                  max_steps=1 if quick else 4, log=print, lengths=lengths, budget_s=tune_budget_s)
    print(result.table(), flush=True)
    tuned = parse_config((repo / "m" / "config.pbtxt").read_text())
    return {"model_file": model_file, "derived": plan.context, "derived_s": derived_s,
            "tuned_config": tuned, "tuned_s": derived_s + result.wall_s,
            "derived_summary": f"b{derivation.max_batch_size} i{derivation.instance_count} "
                               f"d{derivation.dynamic_batching['max_queue_delay_microseconds']} pref "
                               f"{','.join(map(str, derivation.dynamic_batching.get('preferred_batch_size', []))) or '-'}",
            "tuned_summary": result.best.candidate.label}


# ---- Model Analyzer ---------------------------------------------------------------------------

def model_analyzer(venv: Path) -> Path:
    """The model-analyzer command in its own venv, installed on first use."""
    binary = venv / "bin" / "model-analyzer"
    if not binary.exists():
        print(f"installing {MODEL_ANALYZER} into {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", MODEL_ANALYZER], check=True)
    return binary


def run_model_analyzer(binary: Path, mode: str, repo: Path, model: str, slo_ms: float, data: Path,
                       work: Path, install, quick: bool) -> dict:
    """MA's best config under the SLO (remote mode) and its wall time."""
    from latte.generator.validate import parse_config
    from latte.triton import TritonServer
    from latte.triton.perf import find_perf_analyzer

    out = work / f"ma_{mode}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.perf_counter()
    with TritonServer(repo, install=install, log_path=out / "tritonserver.log",
                      extra_args=["--model-control-mode=explicit", f"--load-model={model}"]) as server:
        config = {
            "model_repository": str(repo), "triton_launch_mode": "remote", "client_protocol": "grpc",
            "triton_grpc_endpoint": server.grpc_url, "triton_http_endpoint": server.http_url,
            "triton_metrics_url": server.metrics_url, "perf_analyzer_path": str(find_perf_analyzer()),
            "run_config_search_mode": mode, "export_path": str(out / "export"),
            "output_model_repository_path": str(out / "variants"), "override_output_model_repository": True,
            "checkpoint_directory": str(out / "checkpoints"),
            "collect_cpu_metrics": False, "dcgm_disable": True, "objectives": ["perf_throughput"],
            "constraints": {"perf_latency_p99": {"max": slo_ms}},
            # The same stability band `latte tune` and the head-to-head measure with: a busy host's
            # swings must not abort MA's search either.
            "profile_models": {model: {"cpu_only": True,
                                       "perf_analyzer_flags": {"input-data": str(data),
                                                               "stability-percentage": 100}}},
        }
        if quick:  # a smoke run: a small grid and few re-measurements (MA's defaults are kept otherwise)
            config.update(run_config_search_max_concurrency=8, run_config_search_max_instance_count=2,
                          run_config_search_max_model_batch_size=16, perf_analyzer_max_auto_adjusts=1)
        (out / "config.json").write_text(json.dumps(config, indent=2))
        # MA reads YAML; JSON is YAML.
        subprocess.run([str(binary), "profile", "-f", str(out / "config.json")], check=True,
                       stdout=open(out / "model-analyzer.log", "w"), stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    skipped = (out / "model-analyzer.log").read_text().count("Skipping illegal run configuration")
    if skipped:
        print(f"  warning: Model Analyzer skipped {skipped} illegal configuration(s); see "
              f"{out / 'model-analyzer.log'}", flush=True)
    best = best_ma_variant(out / "export" / "results" / "metrics-model-inference.csv")
    variant_dir = out / "variants" / best
    return {"config": parse_config((variant_dir / "config.pbtxt").read_text()), "wall_s": wall, "variant": best}


def earlier_model_analyzer(previous: Path, case: str, case_dir: str, mode: str) -> dict:
    """The config and wall time of a Model Analyzer search made by an earlier run of this
    script (--out PREVIOUS), to be served again in this run's rounds."""
    from latte.generator.validate import parse_config

    rows = {row["case"]: row for row in json.loads((previous / "results.json").read_text())}
    result = rows.get(case, {}).get("results", {}).get(f"ma_{mode}")
    if result is None:
        raise SystemExit(f"{previous / 'results.json'} has no Model Analyzer {mode} search for {case}")
    variant = result["config"]
    config_path = previous / case_dir / f"ma_{mode}" / "variants" / variant / "config.pbtxt"
    return {"config": parse_config(config_path.read_text()), "wall_s": result["wall_s"], "variant": variant}


def best_ma_variant(csv_path: Path) -> str:
    """The variant with the highest throughput among the rows that satisfy the constraints."""
    import csv

    with open(csv_path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("Satisfies Constraints", "Yes").strip().lower() == "yes"]
    if not rows:
        raise RuntimeError(f"{csv_path}: Model Analyzer found no config within the SLO")
    best = max(rows, key=lambda r: float(r["Throughput (infer/sec)"]))
    return best["Model Config Path"]


# ---- head to head -----------------------------------------------------------------------------

def measure(name: str, url: str, data: Path, slo_ms: float, levels: List[int], measurement_ms: int) -> dict:
    """The config's best throughput with P99 <= SLO (and that P99) as concurrency doubles from
    levels[0] until P99 passes the SLO or throughput stops growing (latte.generator.tune's
    scan, up to levels[-1]), and the same among the levels up to NARROW_LEVEL only."""
    from latte.generator.tune import closed_loop_scan
    from latte.triton.perf import PerfAnalyzerError, run_perf_analyzer

    def run(concurrency):
        return run_perf_analyzer(name, url, concurrency=concurrency, input_data=data,
                                 measurement_ms=measurement_ms, max_trials=6, stability_percentage=100.0)[0]
    try:
        best, best_p99, level, rows = closed_loop_scan(run, slo_ms, levels[0], levels[-1])
    except PerfAnalyzerError:  # rejected or timed out at the first level: nothing within the SLO
        best, best_p99, level, rows = 0.0, float("nan"), 0, []
    narrow = [r for r in rows if r["concurrency"] <= NARROW_LEVEL and "throughput" in r and r["p99_ms"] <= slo_ms]
    top = max(narrow, key=lambda r: r["throughput"], default=None)
    return {"infer_s": best, "p99_ms": best_p99 if best else float("nan"), "level": level,
            "narrow_infer_s": top["throughput"] if top else 0.0, "rows": rows}


def write_proto_model(repo: Path, name: str, config, model_file: Path) -> None:
    from google.protobuf import text_format

    config = copy.deepcopy(config)
    config.name = name
    config.ClearField("model_warmup")
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(text_format.MessageToString(config))
    shutil.copy2(model_file, folder / "1" / config.parameters["model_file"].string_value)


def bench_case(case: str, work: Path, install, cost, cost_s: float, args) -> dict:
    from latte.examples import CATALOG
    from latte.generator.model_folder import render_model_config
    from latte.generator.validate import parse_config
    from latte.triton import TritonServer
    from latte.triton.perf import write_input_data

    example, slo_text = case.split(":")
    slo_ms = float(slo_text)
    case_dir = work / f"{example}_{slo_text}ms"
    case_dir.mkdir(parents=True, exist_ok=True)
    print(f"{case}: profiling, calibrating, deriving, tuning", flush=True)
    latte = latte_configs(example, slo_ms, case_dir, install, cost, cost_s, args.quick, args.tune_budget_s)
    derived = parse_config(render_model_config({**latte["derived"], "warmup": []}))
    default = copy.deepcopy(derived)
    default.ClearField("dynamic_batching")
    default.dynamic_batching.SetInParent()
    del default.instance_group[1:]
    default.instance_group[0].count = 1
    default.parameters.pop("bucket_edges", None)
    default.parameters.pop("arena_bytes", None)
    data = write_input_data(case_dir / "inputs.json",
                            lognormal_samples(derived, CATALOG[example].max_sequence_length or LENGTH_MEDIAN))
    configs = {"derived": derived, "tuned": latte["tuned_config"], "default": default}
    walls = {"derived": latte["derived_s"], "tuned": latte["tuned_s"], "default": 0.0}
    notes = {"derived": latte["derived_summary"], "tuned": latte["tuned_summary"], "default": "Triton default"}
    if not args.skip_model_analyzer:
        binary = None if args.model_analyzer_from else model_analyzer(Path(args.model_analyzer_venv))
        ma_repo = case_dir / "ma_repo"
        shutil.rmtree(ma_repo, ignore_errors=True)
        # Model Analyzer starts at concurrencies past the derived queue bound (2 x max_batch_size x
        # instances), perf_analyzer aborts at the first rejection, and a failed default leaves MA
        # with nothing: it gets the derived config without latte's queue policy, which it does not
        # search anyway. Nor with preferred sizes: its first step sets max_batch_size 1, a
        # preferred size above that makes the step illegal, and the quick search ends there.
        base = copy.deepcopy(derived)
        base.dynamic_batching.ClearField("default_queue_policy")
        base.dynamic_batching.ClearField("preferred_batch_size")
        write_proto_model(ma_repo, "m", base, latte["model_file"])
        for mode in args.model_analyzer_searches.split(","):
            if args.model_analyzer_from:
                ma = earlier_model_analyzer(Path(args.model_analyzer_from), case, case_dir.name, mode)
                print(f"{case}: Model Analyzer {mode} search from {args.model_analyzer_from}: {ma['variant']}, "
                      f"searched in {ma['wall_s']:.0f} s", flush=True)
            else:
                print(f"{case}: Model Analyzer {mode} search", flush=True)
                ma = run_model_analyzer(binary, mode, ma_repo, "m", slo_ms, data, case_dir, install, args.quick)
            configs[f"ma_{mode}"], walls[f"ma_{mode}"], notes[f"ma_{mode}"] = ma["config"], ma["wall_s"], ma["variant"]

    repo = case_dir / "head_to_head"
    shutil.rmtree(repo, ignore_errors=True)
    for name, config in configs.items():
        write_proto_model(repo, f"{example}_{name}", config, latte["model_file"])
    levels = QUICK_LEVELS if args.quick else LEVELS
    measurement_ms = 500 if args.quick else MEASUREMENT_MS
    rounds: Dict[str, List[tuple]] = {name: [] for name in configs}
    with TritonServer(repo, install=install, log_path=case_dir / "tritonserver.log") as server:
        for index in range(args.rounds):
            order = list(configs) if index % 2 == 0 else list(reversed(configs))
            for name in order:
                score = measure(f"{example}_{name}", server.grpc_url, data, slo_ms, levels, measurement_ms)
                rounds[name].append(score)
                print(f"  round {index + 1} {name}: {score['infer_s']:.0f} infer/s (P99 {score['p99_ms']:.2f} ms "
                      f"at {score['level']} in flight; {score['narrow_infer_s']:.0f} up to {NARROW_LEVEL})", flush=True)
    results = {}
    for name, scores in rounds.items():
        results[name] = {"infer_s": statistics.median(s["infer_s"] for s in scores),
                         "p99_ms": statistics.median(s["p99_ms"] for s in scores),
                         "level": statistics.median(s["level"] for s in scores),
                         "narrow_infer_s": statistics.median(s["narrow_infer_s"] for s in scores),
                         "wall_s": walls[name], "config": notes[name], "rounds": scores}
    return {"case": case, "model": example, "slo_ms": slo_ms, "results": results, "calibration_s": cost_s}


def print_table(rows: List[dict]) -> None:
    print()
    print(f"| model | SLO P99 | config | infer/s | P99 ms | in flight | infer/s up to {NARROW_LEVEL} | wall s | settings |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        for name in CONFIGS:
            r = row["results"].get(name)
            if r is None:
                continue
            print(f"| {row['model']} | {row['slo_ms']:g} ms | {name.replace('_', ' ')} | {r['infer_s']:.0f} | "
                  f"{r['p99_ms']:.2f} | {r['level']:g} | {r['narrow_infer_s']:.0f} | {r['wall_s']:.1f} | {r['config']} |")
    print()
    print("| model | SLO P99 | derived / MA quick | wall | wall, calibration kept | tuned / MA brute | wall | wall, calibration kept |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        res = row["results"]

        def ratio(a: str, b: str, key: str) -> str:
            if b not in res or not res[b][key]:
                return "-"
            return f"{res[a][key] / res[b][key]:.2f}x" if key == "infer_s" else f"{res[a][key] / res[b][key]:.1%}"
        def kept(a: str, b: str) -> str:
            """The wall-time share on a machine whose calibration is kept from an earlier run."""
            if b not in res or not res[b]["wall_s"]:
                return "-"
            return f"{(res[a]['wall_s'] - row.get('calibration_s', 0.0)) / res[b]['wall_s']:.1%}"
        print(f"| {row['model']} | {row['slo_ms']:g} ms | {ratio('derived', 'ma_quick', 'infer_s')} | "
              f"{ratio('derived', 'ma_quick', 'wall_s')} | {kept('derived', 'ma_quick')} | "
              f"{ratio('tuned', 'ma_brute', 'infer_s')} | {ratio('tuned', 'ma_brute', 'wall_s')} | "
              f"{kept('tuned', 'ma_brute')} |")


HERE = Path(__file__).resolve().parent
LABELS = {"derived": "derived", "tuned": "tuned", "ma_quick": "Model Analyzer quick",
          "ma_brute": "Model Analyzer brute", "default": "Triton default"}


def summarize(row: dict) -> dict:
    """The page's view of one case: each config's rounds, the two targets, rounds against wall time."""
    res, model, slo = row["results"], row["model"], row["slo_ms"]
    targets = []
    for ours, theirs, want, share in (("derived", "ma_quick", 1.0, 0.05), ("tuned", "ma_brute", 1.05, 0.10)):
        if ours not in res or theirs not in res or not res[theirs]["infer_s"] or not res[theirs]["wall_s"]:
            continue
        ratio = res[ours]["infer_s"] / res[theirs]["infer_s"]
        wall = res[ours]["wall_s"] / res[theirs]["wall_s"]
        same = res[ours]["config"] == res[theirs]["config"]
        targets.append(Target(f"{model} ≤ {slo:g} ms: {ours} ≥ {want:g}x {LABELS[theirs]}'s search at ≤ {share:.0%} "
                              "of its wall time", f"{ratio:.2f}x at {wall:.1%}" + (" (one config)" if same else ""),
                              "yes" if ratio >= want and wall <= share else ("partly" if wall <= share else "no"),
                              why=("the same config on both sides: the ratio is the rounds' spread" if same else
                                   "wall time met; throughput not" if wall <= share else "")))
    rows = [[LABELS[name], f"{r['infer_s']:,.0f} (" + " / ".join(f"{x['infer_s']:,.0f}" for x in r["rounds"]) + ")",
             f"{r['p99_ms']:.2f} ms", f"{r['level']:g}", f"{r['narrow_infer_s']:,.0f}", f"{r['wall_s']:,.1f} s",
             str(r["config"])] for name, r in res.items()]
    measured = [name for name, r in res.items() if r["wall_s"] and r["wall_s"] > 0]
    chart = Chart(f"generator-{model}-{slo:g}".replace(".", "-"), f"{model}, P99 ≤ {slo:g} ms: each config's rounds",
                  "wall time to choose the config (s, log)", "infer/s",
                  [Series(LABELS[name], [(round(res[name]["wall_s"], 1), x["infer_s"]) for x in res[name]["rounds"]])
                   for name in measured],
                  marks=[("derived, median", round(res["derived"]["wall_s"], 1), res["derived"]["infer_s"])]
                  if "derived" in measured else [], log_x=True)
    return dict(
        summary=(f"Each config served side by side by one tritonserver, perf_analyzer in closed loop with lognormal "
                 f"lengths, concurrency doubling until P99 passes {slo:g} ms; a config's score is its best throughput "
                 "within the SLO, the median of interleaved rounds."),
        targets=targets,
        tables=[Table("", ["config", "infer/s (rounds)", "P99 at the best level", "in flight",
                           f"infer/s up to {NARROW_LEVEL} in flight", "wall", "settings"], rows)],
        charts=[chart] if measured else [])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help="MODEL:SLO_MS pairs (default %(default)s)")
    parser.add_argument("--out", default=".latte/bench-generator")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds (default {ROUNDS})")
    parser.add_argument("--recalibrate", action="store_true",
                        help="measure this machine's serving cost again instead of using the kept one")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: short profile, one tuning step, two levels, short windows")
    parser.add_argument("--skip-model-analyzer", action="store_true", help="leave out the MA quick/brute columns")
    parser.add_argument("--tune-budget-s", type=float, metavar="SECONDS",
                        help="`latte tune --budget-s`: the tuner's time budget (default: none)")
    parser.add_argument("--model-analyzer-searches", default="quick,brute",
                        help="Model Analyzer's searches to run, of quick,brute (default %(default)s)")
    parser.add_argument("--model-analyzer-from", metavar="PREVIOUS_OUT",
                        help="serve the configs Model Analyzer's searches chose in an earlier run's --out "
                             "directory, with their wall times, instead of searching again (~30 min a brute search)")
    parser.add_argument("--model-analyzer-venv", default=str(MODEL_ANALYZER_VENV),
                        help="where Model Analyzer is installed (default %(default)s)")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where generator-<model>-<slo>.json, the page's input, goes (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.model_analyzer_from and not (Path(args.model_analyzer_from) / "results.json").is_file():
        parser.error(f"{args.model_analyzer_from} has no results.json: give the --out directory of a finished run")
    from latte.generator.calibrate import machine_serving_cost
    from latte.triton import find_triton

    # SIGTERM unwinds like Ctrl-C, so the tritonservers started below are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    install = find_triton()
    started = time.perf_counter()
    cost = machine_serving_cost(install, log=print, refresh=args.recalibrate)
    cost_s = time.perf_counter() - started
    print(f"serving cost: {'measured in this run' if cost_s > 1.0 else 'kept from an earlier run'} "
          f"({cost_s:.1f} s, counted in the derived wall time)", flush=True)
    rows = []
    for case in args.cases.split(","):
        record = new_results("", "generator", "", command_line("benchmarks/generator.py", argv),
                             wait_until_quiet(log=print), HERE)
        rows.append(bench_case(case, work, install, cost, cost_s, args))
        row = rows[-1]
        record.benchmark = f"generator-{row['model']}-{row['slo_ms']:g}"
        record.title = f"Generator: {row['model']} at P99 ≤ {row['slo_ms']:g} ms against Model Analyzer"
        print(f"wrote {write_summary(record, summarize(row), args.results_dir, row)}", flush=True)
    (work / "results.json").write_text(json.dumps(rows, indent=2))
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
