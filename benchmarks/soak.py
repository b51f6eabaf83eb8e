"""Soak benchmark: a steady variable-shape load, sampled per window, growth ratios first -> last.

    .venv/bin/python benchmarks/soak.py --requests 1000000               # the target run (on demand)
    .venv/bin/python benchmarks/soak.py --requests 200000 --model sequence_torchscript
    .venv/bin/python benchmarks/soak.py --requests 1000000 --pipeline text --in-flight 16   # a fused pipeline
    .venv/bin/python benchmarks/soak.py --requests 1000000 --arena-pages     # the model's arena paged (docs/memory.md)
    .venv/bin/python benchmarks/soak.py --requests 1000000 --arena-pages --control   # drift read against a plain copy

Builds the example repository (with --pipeline, that example pipeline generated and fused, its
model the ensemble's name, its requests the example's texts or images), starts tritonserver,
runs the soak and writes the windows to .latte/soak/soak-<model>.json, and its summary to
benchmarks/results/soak-<model>.json (docs/benchmarks.md is rendered from it:
`.venv/bin/python -m latte.bench.page`). Targets after 1M requests: RSS growth <= 2 %, P99 drift <= 5 %,
and the arena's fragmentation alarm never raised: the P99 request always fits in one free block
when the free bytes would hold it, and no allocation fails with live + request <= 80 % of the
capacity (docs/memory.md).

With --control, the same model file served by Triton's stock Python backend (`control_<model>`,
one request at a time as its documentation shows) is served beside it and sent the same
requests, the two taking turns in slices of every window. A shared machine's own swing moves
both, so the latency drift is judged against the control's: (1 + the model's drift) / (1 + the
control's) - 1, and each window shows latte's P99 against the control's. What the two share, the
server process and the host, cancels out; what is latte's alone (its stub, its arena, its
engine) does not, even where every latte model shares it. Each model's throughput is then its
requests over the whole window, about half what it serves alone. (A CPU instance's arena
is paged by default; --arena-pages says so in its config and the results' name.)
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import time
from pathlib import Path

from latte.bench.lengths import LengthDistribution
from latte.bench.quiet import wait_until_quiet
from latte.bench.results import Chart, Series, Table, Target, command_line, machine_description, new_results, write_summary
from latte.bench.soak import LONG_TARGETS, SoakSettings, check_ratios, describe_targets, format_ratios, run_soak
from latte.bench.target import start_or_attach
from latte.examples import EXAMPLES, FORMATS, build_examples, write_served_copy
from latte.examples.pipeline import PIPELINES, write_pipeline
from latte.generator.generate import generate


HERE = Path(__file__).resolve().parent


def summarize(result: dict, name: str = "") -> dict:
    """What the page shows of a soak: the targets, a table of first and last windows, the
    memory and latency curves over the run."""
    ratios, windows = result["ratios"], result["windows"]
    failures = check_ratios(ratios, LONG_TARGETS)

    def pct(key):
        return "not exported" if ratios.get(key) is None else f"{ratios[key]:+.1%}"

    first, last = windows[0], windows[-1]
    rows = [[label, f"{first[key]:{fmt}}", f"{last[key]:{fmt}}", pct(change) if change else ""]
            for label, key, fmt, change in (
                ("tritonserver RSS (MiB)", "server_rss_mb", ".1f", "server_rss_growth"),
                ("stubs' RSS (MiB)", "stubs_rss_mb", ".1f", "stubs_rss_growth"),
                ("P50 (ms)", "p50_ms", ".2f", "p50_drift"),
                ("P99 (ms)", "p99_ms", ".2f", "p99_drift"),
                ("throughput (req/s)", "throughput", ",.0f", "throughput_change"),
                *((("control's P50 (ms)", "control_p50_ms", ".2f", "control_p50_drift"),
                   ("control's P99 (ms)", "control_p99_ms", ".2f", "control_p99_drift"))
                  if result.get("control") else ()))]
    controlled = result.get("control") is not None
    if controlled:
        rows.append(["P99 against the control's", "", "", pct("p99_drift_vs_control")])
        # Window by window: a drift of latte's own moves this ratio; the host's moves both sides.
        per_window = [w["p99_ms"] / w["control_p99_ms"] for w in windows if w.get("control_p99_ms")]
        if per_window:
            rows.append(["P99, latte / control", f"{per_window[0]:.2f}x", f"{per_window[-1]:.2f}x",
                         f"windows {min(per_window):.2f}-{max(per_window):.2f}x"])
    slug = (name or result["model"]).replace("_", "-").lower()
    sent = list(itertools.accumulate(w["requests"] / 1000 for w in windows))
    answered = (result["requests"] == result["answered"] and result["failed"] == 0
                and not result.get("control_failed") and not result.get("control_unanswered"))
    return dict(
        summary=(f"{result['requests']:,} requests to `{result['model']}` at {result['in_flight']} in flight "
                 f"{len(windows)} windows, {result.get('duration_s', 0):.0f} s; "
                 f"{result['failed']} errors; P99 drift over the median of first and last thirds "
                 f"{pct('p99_drift_thirds')}; arena fragmentation alarm raised in "
                 f"{ratios.get('fragmented_windows', 0):g} windows, {ratios.get('fragmentation_failures', 0):g} "
                 "fragmentation failures."),
        targets=[Target(f"{result['requests']:,} requests to {result['model']}: RSS growth ≤ "
                        f"{LONG_TARGETS['rss_growth']:.0%}, P99 drift ≤ {LONG_TARGETS['p99_drift']:.0%}, no "
                        "fragmentation alarm, every request answered once",
                        f"server {pct('server_rss_growth')}, stubs {pct('stubs_rss_growth')}, P99 "
                        + (f"{pct('p99_drift_vs_control')} against the control's (its own {pct('p99_drift')}, "
                           f"the control's {pct('control_p99_drift')})" if controlled else pct('p99_drift'))
                        + f", {result['failed']} errors",
                        "yes" if not failures and answered else "no", why="; ".join(failures))],
        tables=[Table("First and last window:", ["", "first", "last", "change"], rows)],
        charts=[Chart(f"soak-{slug}-memory", f"{result['model']}: memory over the soak", "thousand requests sent",
                      "RSS (MiB)", [Series("tritonserver", [(x, w["server_rss_mb"]) for x, w in zip(sent, windows)]),
                                    Series("stubs", [(x, w["stubs_rss_mb"]) for x, w in zip(sent, windows)])]),
                Chart(f"soak-{slug}-latency", f"{result['model']}: latency over the soak", "thousand requests sent",
                      "ms", [Series("P50", [(x, w["p50_ms"]) for x, w in zip(sent, windows)]),
                             Series("P99", [(x, w["p99_ms"]) for x, w in zip(sent, windows)]),
                             *([Series("control's P99", [(x, w["control_p99_ms"]) for x, w in zip(sent, windows)])]
                               if controlled else [])])])


def write_control(repo: Path, model: str) -> Path:
    """control_<model>: the same model file served by Triton's stock Python backend, the way its
    documentation shows (latte.examples.stock_python_model), beside the model: a reference that
    shares none of latte's code, so a drift every latte model shares shows against it."""
    entry = json.loads((repo / "examples.json").read_text())[model]
    source = repo / model / "1" / FORMATS[entry["runtime"]]
    shutil.rmtree(repo / f"control_{model}", ignore_errors=True)
    return write_served_copy(repo, EXAMPLES[entry["example"]], source, f"control_{model}", "python")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--model", default="sequence_onnx")
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--lengths", default="lognormal:median=24,sigma=0.8")
    parser.add_argument("--pipeline", choices=sorted(PIPELINES),
                        help="soak an example pipeline's fused model instead (its model: the ensemble's name)")
    parser.add_argument("--arena-pages", action="store_true",
                        help="serve the model from a paged arena (parameters arena_pages: true); its results go "
                             "to soak-<model>-paged.json")
    parser.add_argument("--control", action="store_true",
                        help="serve the same model file in Triton's stock Python backend beside the model, send it "
                             "the same requests in turns, and judge latency drift against it; results go to "
                             "soak-<name>-control.json")
    parser.add_argument("--out", default=".latte/soak")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where soak-<model>.json, the page's input, goes (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.pipeline and (args.arena_pages or args.control):
        parser.error("--arena-pages and --control take an example model; a generated pipeline's fused model is not one")
    out = Path(args.out)
    feeds = None
    if args.pipeline:
        example = PIPELINES[args.pipeline]
        repo = out / f"pipeline-{args.pipeline}" / "repo"
        if not (repo / example.ensemble / "config.pbtxt").exists():
            spec = write_pipeline(repo.parent / "files", name=args.pipeline)
            generate(spec, repo, log=print)
        args.model = example.ensemble
        feeds = example.requests(256)
    else:
        repo = out / ("repository-paged" if args.arena_pages else "repository")
        if not (repo / "examples.json").exists():
            build_examples(repo)
        if args.arena_pages:
            config = repo / args.model / "config.pbtxt"
            if "arena_pages" not in config.read_text():
                with config.open("a") as text:
                    text.write('\nparameters { key: "arena_pages" value: { string_value: "true" } }\n')
        if args.control:
            write_control(repo, args.model)
        else:  # a control left by an earlier run would load beside the model for nothing
            shutil.rmtree(repo / f"control_{args.model}", ignore_errors=True)
    name = (f"{args.model}-paged" if args.arena_pages else args.model) + ("-control" if args.control else "")
    settings = SoakSettings(args.model, requests=args.requests, windows=args.windows, in_flight=args.in_flight,
                            lengths=LengthDistribution.parse(args.lengths), warmup_requests=2000, feeds=feeds,
                            control=f"control_{args.model}" if args.control else None)
    load = wait_until_quiet(log=print)  # building the examples loads the machine for a minute after
    print(f"load average at start: {load:.2f}", flush=True)
    title = (f"Soak: {args.model}" + (", paged arena" if args.arena_pages else "")
             + (", against a stock Python model of it served beside it" if args.control else ""))
    record = new_results(f"soak-{name}", "soak", title, command_line("benchmarks/soak.py", argv), load, HERE)
    started = time.time()
    with start_or_attach(repo, log_path=out / "tritonserver.log") as target:
        result = run_soak(target, settings, lambda done, message: print(f"[{done:4.0%}] {message}", flush=True))
    result["machine"] = machine_description()
    result["load_average_at_start"] = round(load, 2)
    result["duration_s"] = round(time.time() - started, 1)
    path = out / f"soak-{name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{result['requests']} requests ({result['failed']} errors) in {result['duration_s']} s on "
          f"{result['machine']}")
    print("\n".join(format_ratios(result["ratios"])))
    failures = check_ratios(result["ratios"], LONG_TARGETS)
    print(f"targets ({describe_targets(LONG_TARGETS)}): "
          + ("met" if not failures else "NOT met: " + "; ".join(failures)))
    print(f"windows: {path}")
    print(f"summary: {write_summary(record, summarize(result, name), args.results_dir)}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
