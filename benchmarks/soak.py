"""Soak benchmark: a steady variable-shape load, sampled per window, growth ratios first -> last.

    .venv/bin/python benchmarks/soak.py --requests 1000000               # the target run (on demand)
    .venv/bin/python benchmarks/soak.py --requests 200000 --model sequence_torchscript
    .venv/bin/python benchmarks/soak.py --requests 1000000 --pipeline text --in-flight 16   # a fused pipeline

Builds the example repository (with --pipeline, that example pipeline generated and fused, its
model the ensemble's name, its requests the example's texts or images), starts tritonserver,
runs the soak and writes the windows to .latte/soak/soak-<model>.json. Targets after 1M requests: RSS growth <= 2 %, P99 drift <= 5 %,
and the arena's fragmentation alarm never raised: the P99 request always fits in one free block
when the free bytes would hold it, and no allocation fails with live + request <= 80 % of the
capacity (docs/memory.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from latte.bench.lengths import LengthDistribution
from latte.bench.quiet import wait_until_quiet
from latte.bench.runner import machine_description
from latte.bench.soak import LONG_TARGETS, SoakSettings, check_ratios, describe_targets, format_ratios, run_soak
from latte.bench.target import start_or_attach
from latte.examples import build_examples
from latte.examples.pipeline import PIPELINES, write_pipeline
from latte.generator.generate import generate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--model", default="sequence_onnx")
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--lengths", default="lognormal:median=24,sigma=0.8")
    parser.add_argument("--pipeline", choices=sorted(PIPELINES),
                        help="soak an example pipeline's fused model instead (its model: the ensemble's name)")
    parser.add_argument("--out", default=".latte/soak")
    args = parser.parse_args()
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
        repo = out / "repository"
        if not (repo / "examples.json").exists():
            build_examples(repo)
    settings = SoakSettings(args.model, requests=args.requests, windows=args.windows, in_flight=args.in_flight,
                            lengths=LengthDistribution.parse(args.lengths), warmup_requests=2000, feeds=feeds)
    load = wait_until_quiet(log=print)  # building the examples loads the machine for a minute after
    print(f"load average at start: {load:.2f}", flush=True)
    started = time.time()
    with start_or_attach(repo, log_path=out / "tritonserver.log") as target:
        result = run_soak(target, settings, lambda done, message: print(f"[{done:4.0%}] {message}", flush=True))
    result["machine"] = machine_description()
    result["load_average_at_start"] = round(load, 2)
    result["duration_s"] = round(time.time() - started, 1)
    path = out / f"soak-{args.model}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{result['requests']} requests ({result['failed']} errors) in {result['duration_s']} s on "
          f"{result['machine']}")
    print("\n".join(format_ratios(result["ratios"])))
    failures = check_ratios(result["ratios"], LONG_TARGETS)
    print(f"targets ({describe_targets(LONG_TARGETS)}): "
          + ("met" if not failures else "NOT met: " + "; ".join(failures)))
    print(f"windows: {path}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
