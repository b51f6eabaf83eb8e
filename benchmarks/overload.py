"""Overload benchmark: a step to 3x capacity with two priority classes and abandoned sessions.

    .venv/bin/python benchmarks/overload.py                          # sequence_onnx, 30 s step
    .venv/bin/python benchmarks/overload.py --model cnn_onnx --step-s 60
    .venv/bin/python benchmarks/overload.py --compare-queues           # Triton's queue vs latte's

Builds the example repository, renders a variant config of the model (two priority levels; the
low level sheds with a 100 ms queue timeout and a 64-request queue, the high level never sheds;
one instance, so its high-priority tail includes Triton 2.51's ~500 ms batcher stall, which on
the 2-core box costs less under the step than a second instance does; see docs/backend.md
"Priorities"),
starts tritonserver on it and reports per-priority P99, shed rate, that every request got exactly
one answer, and whether memory returned to its pre-step baseline. Writes .latte/overload/<model>.json.

--compare-queues runs another variant: a closed-loop flood of --concurrency default-priority
requests while a probe, in a process of its own, sends one high-priority request at a time (until
--probe-requests answers or --probe-s seconds), first against Triton's priority queue (the
config above) and then against latte's own (`async_execute: true` and `max_queue_size`, no Triton
priority levels); a second probe sends the same requests to an idle copy of the model at the same
time (what the machine alone adds under the flood). It prints each queue's high-priority P99
against the flood's (the default class) and the idle copy's, and writes
.latte/overload/<model>-queues.json.

Each mode's summary replaces benchmarks/results/overload.json or overload-priorities.json, from
which docs/benchmarks.md is rendered (`.venv/bin/python -m latte.bench.page`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from latte.bench.lengths import LengthDistribution
from latte.bench.quiet import wait_until_quiet
from latte.bench.results import Table, Target, command_line, machine_description, new_results, write_summary
from latte.bench.overload import (IDLE, LATTE_QUEUE, TRITON_QUEUE, OverloadSettings, QueueFloodSettings, run_overload,
                                  run_queue_flood, write_overload_repository, write_queue_flood_repository)
from latte.bench.target import start_or_attach
from latte.examples import build_examples


HERE = Path(__file__).resolve().parent


def summarize_step(result: dict, args) -> dict:
    step, whole = result["per_phase"]["step"], result["whole_run"]
    memory = result["memory_return"]
    return dict(
        summary=(f"Capacity measured first ({result['capacity_rps']} req/s), then a step to {args.overload:g}x for "
                 f"{args.step_s:g} s, two priority classes, `{args.model}` on one instance. One run: the step is "
                 "the measurement, with no contender to interleave."),
        targets=[Target("every request answered exactly once", f"{whole['sent']:,} sent, {whole['answered']:,} answered",
                        "yes" if whole["every_request_answered_once"] else "no"),
                 Target(f"high-priority P99 ≤ {args.high_slo_ms:g} ms during a {args.overload:g}x step",
                        f"{step['high']['p99_ms']} ms", "yes" if step["high"]["slo_held"] else "no")],
        tables=[Table("", ["class", "sent", "P50 ms", "P99 ms", "shed"],
                      [[cls, f"{step[cls]['sent']:,}", f"{step[cls]['p50_ms']}", f"{step[cls]['p99_ms']}",
                        f"{step[cls]['shed_rate']:.1%}"] for cls in ("high", "low")])],
        notes=[f"tritonserver RSS after the step {memory['server_rss_after_vs_baseline']:+.1%}, the stubs "
               f"{memory['stubs_rss_after_vs_baseline']:+.1%}; "
               + ("ready afterwards" if result["server_alive_after"] else "NOT ready afterwards")
               + f", with {result['abandoned_sessions']} abandoned sessions."])


def summarize_queues(results: dict, variants, args) -> dict:
    rows, targets = [], []
    for variant in variants:
        r = results[variant]
        high, idle, flood = r["high"], r.get(IDLE), r["flood"]
        rows.append([variant, f"{high['p50_ms']}", f"{high['p99_ms']}", f"{high['over_100_ms']} of {high['answered']:,}",
                     f"{high['max_ms']}", f"{idle['p99_ms']} ({idle['over_100_ms']})" if idle else "-",
                     f"{flood['p99_ms']} ({flood['shed_rate']:.0%} shed)", f"{r['high_vs_default_p99']}"])
        if variant == LATTE_QUEUE:
            held = high["p99_ms"] <= 50 and r["high_vs_default_p99"] <= 0.5
            targets.append(Target("latte's queue: high-priority P99 ≤ 50 ms and ≤ 0.5x the default class's",
                                  f"{high['p99_ms']} ms, {r['high_vs_default_p99']}x", "yes" if held else "no"))
    return dict(
        summary=(f"A closed-loop flood of {args.concurrency} default-priority requests; a probe sends one "
                 "high-priority request at a time, and a second probe the same requests to an idle copy of the "
                 "model (the box's own tail under the flood). One run."),
        targets=targets,
        tables=[Table("", ["queue", "high P50 ms", "high P99 ms", "high over 100 ms", "high max ms",
                           "idle copy P99 ms (over 100 ms)", "default (flood) P99 ms", "high / default P99"], rows)])


def record(benchmark: str, title: str, load: float, summary: dict, figures: dict, directory: Path) -> None:
    results = new_results(benchmark, "overload", title, command_line("benchmarks/overload.py", None), load, HERE)
    print(f"wrote {write_summary(results, summary, directory, figures)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sequence_onnx")
    parser.add_argument("--step-s", type=float, default=30.0)
    parser.add_argument("--baseline-s", type=float, default=10.0)
    parser.add_argument("--recovery-s", type=float, default=10.0)
    parser.add_argument("--overload", type=float, default=3.0, help="step load as a multiple of capacity")
    parser.add_argument("--high-slo-ms", type=float, default=500.0)
    parser.add_argument("--lengths", default="fixed:length=128")
    parser.add_argument("--out", default=".latte/overload")
    parser.add_argument("--compare-queues", action="store_true",
                        help="flood Triton's priority queue and latte's own instead of the overload step")
    parser.add_argument("--concurrency", type=int, default=512, help="--compare-queues: the flood's requests in flight")
    parser.add_argument("--probe-s", type=float, default=20.0, help="--compare-queues: the most probe time per queue")
    parser.add_argument("--probe-requests", type=int, default=10_000,
                        help="--compare-queues: high-priority answers after which the probe stops")
    parser.add_argument("--queues", default=f"{TRITON_QUEUE},{LATTE_QUEUE}",
                        help="--compare-queues: which queues to flood, in order (default: %(default)s)")
    parser.add_argument("--no-idle-copy", action="store_true",
                        help="--compare-queues: no second probe of an idle copy (one probe alone, as a lone client sees it)")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where overload.json or overload-priorities.json, the page's input, goes "
                             "(default: %(default)s)")
    args = parser.parse_args()
    out = Path(args.out)
    examples = out / "examples"
    if not (examples / "examples.json").exists():
        build_examples(examples)
    load = wait_until_quiet(log=print)  # building the examples loads the machine for a minute after
    if args.compare_queues:
        return compare_queues(args, examples, out, load)
    repo = write_overload_repository(examples, args.model, out / "repository")
    settings = OverloadSettings(args.model, baseline_s=args.baseline_s, step_s=args.step_s,
                                recovery_s=args.recovery_s, overload=args.overload, high_slo_ms=args.high_slo_ms,
                                lengths=LengthDistribution.parse(args.lengths))
    with start_or_attach(repo, log_path=out / "tritonserver.log") as target:
        result = run_overload(target, settings, lambda message: print(message, flush=True))
    result["machine"] = machine_description()
    path = out / f"{args.model}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    step = result["per_phase"]["step"]
    print(f"\ncapacity {result['capacity_rps']} req/s; step {args.overload:g}x for {args.step_s:g} s "
          f"on {result['machine']}")
    for cls in ("high", "low"):
        c = step[cls]
        print(f"  {cls:4} priority: sent {c['sent']}, P50 {c['p50_ms']} ms, P99 {c['p99_ms']} ms, "
              f"shed {c['shed_rate']:.1%} {c['errors'] or ''}")
    whole = result["whole_run"]
    print(f"every request answered exactly once: {whole['every_request_answered_once']} "
          f"({whole['sent']} sent, {whole['answered']} answered)")
    print(f"high-priority P99 within {args.high_slo_ms:g} ms: {step['high']['slo_held']}")
    memory = result["memory_return"]
    print(f"memory after the step vs before: tritonserver {memory['server_rss_after_vs_baseline']:+.1%}, "
          f"stubs {memory['stubs_rss_after_vs_baseline']:+.1%}")
    print(f"server ready afterwards: {result['server_alive_after']}; abandoned sessions: "
          f"{result['abandoned_sessions']}; details: {path}")
    record("overload", f"Overload: a {args.overload:g}x step for {args.step_s:g} s, high and low priority", load,
           summarize_step(result, args), result, args.results_dir)
    ok = (whole["every_request_answered_once"] and step["high"]["slo_held"] and result["server_alive_after"]
          and memory["server_rss_after_vs_baseline"] <= 0.10)
    return 0 if ok else 1


def compare_queues(args, examples: Path, out: Path, load: float) -> int:
    variants = [v.strip() for v in args.queues.split(",") if v.strip()]
    unknown = [v for v in variants if v not in (TRITON_QUEUE, LATTE_QUEUE)]
    if unknown or not variants:
        print(f"--queues takes {TRITON_QUEUE} and/or {LATTE_QUEUE}, got {args.queues!r}", file=sys.stderr)
        return 2
    settings = QueueFloodSettings(args.model, concurrency=args.concurrency, duration_s=args.probe_s,
                                  probe_requests=args.probe_requests, lengths=LengthDistribution.parse(args.lengths))
    names = write_queue_flood_repository(examples, args.model, out / "queues-repository", settings.max_queue_size)
    results = {}
    with start_or_attach(out / "queues-repository", log_path=out / "tritonserver-queues.log") as target:
        for variant in variants:
            results[variant] = run_queue_flood(target, names[variant], variant, settings,
                                               None if args.no_idle_copy else names[IDLE],
                                               lambda message: print(message, flush=True))
    results["machine"] = machine_description()
    path = out / f"{args.model}-queues.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nflood of {args.concurrency} default-priority requests on {results['machine']}")
    ok = True
    for variant in variants:
        r = results[variant]
        high, idle, flood = r["high"], r.get(IDLE), r["flood"]
        beside = (f"the idle copy at the same time P99 {idle['p99_ms']} ms (P50 {idle['p50_ms']}, max {idle['max_ms']}, "
                  f"{idle['over_100_ms']} over 100 ms of {idle['answered']}); ") if idle else ""
        print(f"  {variant}: high P99 {high['p99_ms']} ms (P50 {high['p50_ms']}, max {high['max_ms']}, "
              f"{high['over_100_ms']} over 100 ms of {high['answered']}, {high['failed']} failed); {beside}"
              f"default (the flood) P99 {flood['p99_ms']} ms (P50 {flood['p50_ms']}, {flood['shed_rate']:.0%} shed); "
              f"high/default P99 {r['high_vs_default_p99']}; flood answered once: {r['every_flood_request_answered_once']}")
        ok = ok and r["every_flood_request_answered_once"] and high["failed"] == 0
    print(f"details: {path}")
    record("overload-priorities", "Priorities under a closed-loop flood: Triton's queue against latte's", load,
           summarize_queues(results, variants, args), results, args.results_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
