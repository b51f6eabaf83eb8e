"""`latte bench`: serving benchmark (perf_analyzer sweeps), soak and overload runs with reports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import List


def _int_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, e.g. 1,2,4,8; got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected numbers >= 1, got {text!r}")
    return values


def _float_list(text: str) -> List[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, e.g. 50,100,200; got {text!r}")
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected rates > 0, got {text!r}")
    return values


def _lengths(text: str):
    from latte.bench.lengths import LengthDistribution, LengthSpecError

    try:
        return LengthDistribution.parse(text)
    except LengthSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def _trials(text: str) -> int:
    value = int(text)
    if value < 3:
        # perf_analyzer calls a point stable only after 3 measurements in a row agree, so
        # fewer trials can never produce a figure.
        raise argparse.ArgumentTypeError(f"must be >= 3 (perf_analyzer judges stability over 3 trials in a row), got {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    from latte.bench.lengths import EXAMPLES_TEXT

    p = sub.add_parser(
        "bench", help="benchmark models on tritonserver (sweeps, soak) -> results.json, report.html",
        description="Drive perf_analyzer over a concurrency sweep and a Poisson request-rate sweep with "
                    "variable-shape inputs, sample Triton's and Latte's metrics and process memory, and write "
                    "OUT/<model>/results.json and report.html. With --soak, run a steady load instead and print "
                    "growth ratios from the first to the last window.")
    p.add_argument("repo", nargs="?", help="model repository to serve (omit with --url)")
    p.add_argument("--model", action="append", dest="models", metavar="M",
                   help="model to benchmark; repeat for several (default: every model in REPO)")
    p.add_argument("--url", metavar="HOST:PORT", help="HTTP endpoint of a running tritonserver instead of starting one")
    p.add_argument("--grpc-url", metavar="HOST:PORT", help="gRPC endpoint of the running server (with --url)")
    p.add_argument("--metrics-url", metavar="URL", help="Prometheus endpoint of the running server (with --url)")
    p.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    p.add_argument("--concurrency", type=_int_list, default=[1, 2, 4, 8], metavar="LIST",
                   help="concurrency levels (default 1,2,4,8)")
    p.add_argument("--request-rates", type=_float_list, metavar="LIST",
                   help="Poisson request rates per second (default: 25,50,75,100 %% of the peak throughput "
                        "the concurrency sweep reached)")
    p.add_argument("--lengths", type=_lengths, default="lognormal:median=24,sigma=0.8", metavar="DIST",
                   help=f"length distribution of variable-shape inputs, e.g. {EXAMPLES_TEXT}")
    p.add_argument("--samples", type=int, default=256, help="distinct requests in perf_analyzer's --input-data")
    p.add_argument("--measurement-ms", type=int, default=1500, help="perf_analyzer measurement window")
    p.add_argument("--max-trials", type=_trials, default=4,
                   help="perf_analyzer trials per load point (at least 3: it judges stability over 3 in a row)")
    p.add_argument("--out", default=".latte/bench", help="output folder (default .latte/bench)")
    p.add_argument("--report-from", metavar="RESULTS_JSON", nargs="+",
                   help="only re-render report.html beside existing results.json files (no server, no load); "
                        "with several, also the index.html one folder up")
    p.add_argument("--streams", action="store_true",
                   help="measure streams instead of perf_analyzer sweeps (chosen by itself for a decoupled model): "
                        "each --concurrency level as concurrent gRPC streams, for tokens/s, time to first token, "
                        "inter-token latency and streams in flight (docs/streaming.md)")
    p.add_argument("--max-tokens", type=int, default=64, help="streams: outputs each request asks for")
    p.add_argument("--seconds", type=float, default=6.0, help="streams: how long each level runs")
    p.add_argument("--soak", metavar="N|DURATION",
                   help="run a soak instead: a request count (20000, 1M) or a duration (90s, 10min, 2h)")
    p.add_argument("--in-flight", type=int, default=4, help="soak: requests in flight at once")
    p.add_argument("--windows", type=int, default=10, help="soak: sampling windows")
    p.add_argument("--slo-ms", type=float, default=100.0,
                   help="soak: the P95 bound the forecast projects latency to (default: %(default)s)")
    p.set_defaults(handler=_bench)


def _models(args) -> List[str]:
    if args.models:
        return args.models
    if args.repo:
        manifest = Path(args.repo) / "examples.json"
        if manifest.exists():
            return list(json.loads(manifest.read_text()))
        models = sorted(d.name for d in Path(args.repo).iterdir() if (d / "config.pbtxt").exists())
        if models:
            return models
        raise ValueError(f"{args.repo} holds no model folder with a config.pbtxt")
    if args.url:
        raise ValueError("with --url, name the models to benchmark with --model")
    raise ValueError("give a model repository to serve, or --url of a running tritonserver")


def _bench(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from latte.bench.target import start_or_attach

    console = Console()
    if args.report_from:
        from latte.bench.report import write_bench_report, write_index

        loaded = []
        for results_path in map(Path, args.report_from):
            loaded.append(json.loads(results_path.read_text()))
            console.print(f"report: {write_bench_report(loaded[-1], results_path.parent)}")
        if len(loaded) > 1:
            console.print(f"index: {write_index(loaded, Path(args.report_from[0]).parent.parent)}")
        return 0
    if args.url and args.repo:
        raise ValueError("give either a repository to serve or --url of a running server, not both")
    models = _models(args)
    if args.soak:
        from latte.bench.soak import parse_soak_amount

        parse_soak_amount(args.soak)  # a typo is reported before a server starts
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f}"),
               TimeElapsedColumn())
    with start_or_attach(Path(args.repo) if args.repo else None, args.url, args.grpc_url, args.metrics_url,
                         log_path=out / "tritonserver.log" if not args.url else None) as target:
        console.print(f"server: http {target.http_url}  grpc {target.grpc_url}  metrics {target.metrics_url}"
                      + ("" if target.started_here else " (running elsewhere)"))
        if args.soak:
            return _soak(args, target, models, console, out)
        from latte.bench.streams import is_decoupled

        streaming = [m for m in models if args.streams or is_decoupled(target.grpc_url, m)]
        if streaming:
            status = _streams(args, target, streaming, console, out)
            models = [m for m in models if m not in streaming]
            if not models:
                return status
        from latte.bench.report import write_bench_report, write_index
        from latte.bench.runner import BenchSettings, run_bench, write_results

        all_results = []
        with Progress(*columns, console=console) as progress:
            for model in models:
                task = progress.add_task(model, total=1)
                settings = BenchSettings(model, args.protocol, args.concurrency, args.request_rates, args.lengths,
                                         args.samples, args.measurement_ms, args.max_trials)

                done = {"n": 0}

                def on_point(message: str, task=task) -> None:
                    progress.update(task, description=message, completed=done["n"])
                    done["n"] += 1

                results = run_bench(target, settings, on_point, lambda n, task=task: progress.update(task, total=n))
                progress.update(task, description=f"{model}: done", completed=done["n"])
                model_out = out / model
                write_results(results, model_out)
                write_bench_report(results, model_out)
                all_results.append(results)
        for r in all_results:
            for point in r.get("points", []):
                if point.get("error"):
                    reason = point["error"].strip().splitlines()[-1]
                    console.print(f"{r['model']}: {point['kind']} {point['level']:g} failed: {reason}")
            s = r["summary"]
            console.print(f"{r['model']}: peak {s.get('peak_throughput', 0):.0f} infer/s, P99 light "
                          f"{s.get('p99_ms_light_load', float('nan')):.2f} ms, P99 at peak "
                          f"{s.get('p99_ms_at_peak', float('nan')):.2f} ms, failed points {s['failed_points']}"
                          f" -> {out / r['model'] / 'report.html'}")
        if len(all_results) > 1:
            console.print(f"index: {write_index(all_results, out)}")
        return 0 if all(r["summary"]["failed_points"] == 0 for r in all_results) else 1


def _streams(args, target, models, console, out: Path) -> int:
    """Streaming models: concurrent gRPC streams at each level; a table each, OUT/<model>/streams.json."""
    from rich.table import Table

    from latte.bench.streams import run_stream_bench

    failed = 0
    for model in models:
        table = Table("streams", "tokens/s", "TTFT p50 ms", "TTFT p99 ms", "inter-token p50 ms", "inter-token p99 ms",
                      "in flight", "errors", title=f"{model}: {args.max_tokens} outputs a request")
        result = run_stream_bench(target.grpc_url, model, args.concurrency, args.seconds, args.max_tokens)
        for point in result["points"]:
            table.add_row(str(point["concurrent"]), f"{point['tokens_per_s']:.0f}", *(
                "-" if point[k] is None else f"{point[k]:.2f}"
                for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")),
                f"{point['in_flight']:.1f}", str(point["errors"]))
            failed += point["errors"]
        console.print(table)
        path = out / model / "streams.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        console.print(f"{model}: {path}")
    return 0 if failed == 0 else 1


def _soak(args, target, models, console, out: Path) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from latte.bench.soak import (LONG_TARGETS, SoakSettings, check_ratios, describe_targets, format_ratios,
                                  parse_soak_amount, run_soak)

    if len(models) != 1:
        raise ValueError(f"a soak loads one model; choose one with --model (repository has {', '.join(models)})")
    settings = SoakSettings(models[0], windows=args.windows, in_flight=args.in_flight, lengths=args.lengths,
                            slo_ms=args.slo_ms, **parse_soak_amount(args.soak))
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task(f"soak {models[0]}", total=1.0)
        result = run_soak(target, settings, lambda done, message: progress.update(task, completed=done,
                                                                                 description=message))
    path = out / f"soak-{models[0]}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    for line in format_ratios(result["ratios"]):
        console.print(line)
    if result["forecast"] is not None:
        from latte.bench.forecast import Forecast, forecast_figure

        figure = out / f"soak-{models[0]}-forecast.png"
        figure.write_bytes(forecast_figure([w["t"] for w in result["windows"]], [w["p95_ms"] for w in result["windows"]],
                                           Forecast.from_dict(result["forecast"]), f"{models[0]}: P95 against uptime"))
        console.print(f"forecast: {result['forecast']['text']} ({figure})")
    failures = check_ratios(result["ratios"], LONG_TARGETS)
    console.print(f"{result['requests']} requests, {result['failed']} errors; targets (after 1M requests): "
                  f"{describe_targets(LONG_TARGETS)}: "
                  + ("[green]met" if not failures else "[red]" + "; ".join(failures)))
    console.print(f"windows: {path}")
    return 0 if not failures and result["failed"] == 0 else 1
