"""Response cache benchmark: repeated requests (Zipf-distributed) with and without Triton's cache.

    .venv/bin/python benchmarks/response_cache.py                       # sequence_onnx, 16 in flight
    .venv/bin/python benchmarks/response_cache.py --model mlp_onnx --zipf 1.2 --distinct 500

Knowledge-base question answering sends the same few questions again and again. This draws
`--requests` requests from a pool of `--distinct` different ones, the k-th most popular with
probability proportional to 1/k^zipf, and replays them in that order with perf_analyzer
(--input-data) against two copies of one example model in one tritonserver: one whose config
enables `response_cache`, one without. It prints each copy's throughput and P99, the ratios
(cache / no cache), and the cache's hit rate, and writes them to OUT/<model>.json; the summary
replaces benchmarks/results/response-cache-<model>.json, from which docs/benchmarks.md is
rendered (`.venv/bin/python -m latte.bench.page`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from latte.bench.quiet import wait_until_quiet
from latte.bench.results import Table, Target, command_line, machine_description, new_results, write_summary
from latte.examples import CATALOG, build_examples, model_context
from latte.generator.model_folder import write_model
from latte.triton import TritonServer
from latte.triton.cache import cache_flag, parse_size
from latte.triton.perf import run_perf_analyzer, write_input_data


def zipf_requests(example, distinct: int, requests: int, exponent: float, seed: int = 0) -> list:
    """`requests` samples from a pool of `distinct`, rank k drawn with probability ~ 1/k^exponent."""
    rng = np.random.default_rng(seed)
    pool = []
    for _ in range(distinct):
        length = int(rng.integers(8, 65)) if example.max_sequence_length else 0
        pool.append({name: array[0] for name, array in example.sample(1, rng, length=length).items()})
    weights = 1.0 / np.arange(1, distinct + 1) ** exponent
    order = rng.choice(distinct, size=requests, p=weights / weights.sum())
    return [pool[i] for i in order]


def write_repository(examples: Path, model: str, out: Path) -> dict:
    """Two copies of the example model, `<model>_cache` (response_cache on) and `<model>_nocache`."""
    info = json.loads((examples / "examples.json").read_text())[model]
    example = CATALOG[info["example"]]
    source = next((examples / model / "1").iterdir())
    names = {}
    for cached in (True, False):
        context = model_context(example, info["runtime"], source.name)
        context.update(name=f"{model}_{'cache' if cached else 'nocache'}", response_cache=cached)
        write_model(out, context, {source.name: source})
        names[cached] = context["name"]
    return {"example": example, "cache": names[True], "nocache": names[False]}


def cache_counts(server: TritonServer, model: str) -> tuple:
    import tritonclient.http as httpclient

    with httpclient.InferenceServerClient(server.http_url) as client:  # an open one would hold the server's stop
        (stats,) = client.get_inference_statistics(model)["model_stats"]
    inference = stats["inference_stats"]
    return inference["cache_hit"]["count"], inference["cache_miss"]["count"], stats["execution_count"]


HERE = Path(__file__).resolve().parent


def summarize(result: dict) -> dict:
    settings, rounds = result["settings"], result["rounds"]

    def med(label, key):
        return statistics.median(r["results"][label][key] for r in rounds)
    executions = {label: [r["results"][label]["executions"] for r in rounds] for label in ("cache", "nocache")}
    met = (result["throughput_ratio"] or 0) > 1 and (result["p99_ratio"] or 9) < 1
    return dict(
        summary=(f"{settings['requests']:,} requests drawn from {settings['distinct']:,} distinct ones with "
                 f"Zipf({settings['zipf']:g}) popularity, perf_analyzer `--input-data` at {settings['concurrency']} "
                 f"in flight, {settings['measurement_ms'] / 1000:g} s windows; a fresh tritonserver per round (the "
                 "cache starts empty), the copies with and without `response_cache { enable: true }` alternating; "
                 f"medians of {len(rounds)} rounds."),
        targets=[Target(f"{result['model']}: a Zipf repeat workload served faster with Triton's cache, ratio in the "
                        "same run", f"throughput {result['throughput_ratio']:.2f}x, P99 {result['p99_ratio']:.2f}x",
                        "yes" if met else "no")],
        tables=[Table("", ["model", "without cache: infer/s, P99", "with cache: infer/s, P99", "throughput ratio",
                           "P99 ratio", "hit rate", "model executions with / without"],
                      [[result["model"], f"{med('nocache', 'throughput'):,.0f}, {med('nocache', 'p99_ms'):.1f} ms",
                        f"{med('cache', 'throughput'):,.0f}, {med('cache', 'p99_ms'):.1f} ms",
                        f"{result['throughput_ratio']:.2f}x", f"{result['p99_ratio']:.2f}x",
                        f"{result['hit_rate']:.1%}",
                        f"{min(executions['cache'])}-{max(executions['cache'])} / "
                        f"{min(executions['nocache'])}-{max(executions['nocache'])}"]])])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sequence_onnx", help="an example model (default: %(default)s)")
    parser.add_argument("--distinct", type=int, default=1000, help="different requests in the pool")
    parser.add_argument("--requests", type=int, default=20000, help="requests in the replayed sequence")
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of request popularity")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--measurement-ms", type=int, default=5000)
    parser.add_argument("--max-trials", type=int, default=6)
    parser.add_argument("--stability-percentage", type=float, default=25.0,
                        help="perf_analyzer's bound on trial-to-trial variation (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each on a fresh server (default: %(default)s)")
    parser.add_argument("--cache-size", default="256Mi", help="Triton's cache (default: %(default)s)")
    parser.add_argument("--out", default=".latte/response_cache")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where response-cache-<model>.json, the page's input, goes (default: %(default)s)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    examples = out / "examples"
    if not (examples / "examples.json").exists():
        build_examples(examples)
    plan = write_repository(examples, args.model, out / "repository")
    data = write_input_data(out / "input_data.json",
                            zipf_requests(plan["example"], args.distinct, args.requests, args.zipf))
    load = wait_until_quiet(log=print)  # building the examples loads the machine for a minute after
    record = new_results(f"response-cache-{args.model}", "cache", f"Triton's response cache on a Zipf repeat workload: "
                         f"{args.model}", command_line("benchmarks/response_cache.py", argv), load, HERE)
    rounds = []
    for round_ in range(args.rounds):
        # A fresh server per round, so every round starts from an empty cache; the two
        # contenders alternate in order from round to round.
        results = {}
        order = ("nocache", "cache") if round_ % 2 == 0 else ("cache", "nocache")
        with TritonServer(out / "repository", log_path=out / "tritonserver.log",
                          response_cache_bytes=parse_size(args.cache_size)) as server:
            for label in order:
                (point,) = run_perf_analyzer(plan[label], server.grpc_url, concurrency=[args.concurrency],
                                             input_data=data, measurement_ms=args.measurement_ms,
                                             max_trials=args.max_trials,
                                             stability_percentage=args.stability_percentage)
                hits, misses, executions = cache_counts(server, plan[label])
                results[label] = {**point.as_dict(), "cache_hits": hits, "cache_misses": misses,
                                  "executions": executions}
                print(f"round {round_ + 1} {label:8s} {point.throughput:9.1f} infer/s  P99 {point.p99_ms:7.2f} ms  "
                      f"hits {hits}  misses {misses}  model executions {executions}", flush=True)
        cache, nocache = results["cache"], results["nocache"]
        lookups = cache["cache_hits"] + cache["cache_misses"]
        rounds.append({
            "results": results,
            "throughput_ratio": cache["throughput"] / nocache["throughput"] if nocache["throughput"] else None,
            "p99_ratio": cache["p99_ms"] / nocache["p99_ms"] if nocache["p99_ms"] else None,
            "hit_rate": cache["cache_hits"] / lookups if lookups else None,
        })

    def median(key):
        values = sorted(r[key] for r in rounds if r[key] is not None)
        return values[len(values) // 2] if values else None

    summary = {key: median(key) for key in ("throughput_ratio", "p99_ratio", "hit_rate")}
    print(f"with / without cache, median of {args.rounds} round(s): throughput x{summary['throughput_ratio']:.2f}, "
          f"P99 x{summary['p99_ratio']:.2f}; hit rate {summary['hit_rate']:.1%} ({args.distinct} distinct of "
          f"{args.requests}, Zipf {args.zipf}; load {load:.2f} at the start)")
    result = {"model": args.model, "settings": {k: v for k, v in vars(args).items() if k != "results_dir"},
              "cache_flag": cache_flag(parse_size(args.cache_size)),
              "load_at_start": load, "machine": machine_description(), "rounds": rounds, **summary}
    path = out / f"{args.model}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    print(f"wrote {write_summary(record, summarize(result), args.results_dir, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
