"""Two revisions of latte served side by side by one tritonserver: what a change did to served
throughput, with the machine's own drift taken out.

    .venv/bin/python benchmarks/revision_ab.py --baseline REV [--model identity,sequence] [--rounds 3]
                                               [--concurrency 1,16] [--measurement-ms 2000] [--out ab.json]

REV (a commit, e.g. the one before a change) is built once into build/ab/REV/site. Per model,
one server serves the same model file twice, `NAME_current` by the checked-out latte and
`NAME_baseline` by REV's (a backend directory of its own, `latte_baseline`, whose model.py puts
REV's build first on the path of that model's stub process). perf_analyzer drives each at the
same requests, rounds interleaved with the order alternating; each round's current / baseline
ratio at each level is printed, and their median. The models and their settings are
benchmarks/serving.py's. The figures replace benchmarks/results/revision-ab.json, rendered in
the page's Serving section (`.venv/bin/python -m latte.bench.page`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import serving  # noqa: E402  (benchmarks/ is not a package)

from latte.bench.quiet import wait_until_quiet  # noqa: E402
from latte.bench.results import Table, command_line, new_results, utc_now, write_summary  # noqa: E402
from latte.examples import CATALOG, write_served_copy  # noqa: E402
from latte.triton import TritonServer  # noqa: E402
from latte.triton.backend_dir import install_backend  # noqa: E402
from latte.triton.locate import find_triton  # noqa: E402
from latte.triton.perf import write_input_data  # noqa: E402

BASELINE_BACKEND = "latte_baseline"
# The baseline's own backend/model.py, run with the baseline's build first on its stub's path.
SHIM = '''"""latte at revision {rev}, for an A/B beside the checked-out one (benchmarks/revision_ab.py)."""
import sys

sys.path.insert(0, {site!r})
with open({model!r}) as own:
    exec(compile(own.read(), {model!r}, "exec"))
'''


def build_baseline(rev: str) -> Path:
    """REV's latte built into build/ab/REV/site (once)."""
    commit = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True)
    if commit.returncode != 0:
        raise SystemExit(f"revision_ab.py: {rev!r} is not a revision of this repository")
    where = ROOT / "build" / "ab" / commit.stdout.strip()
    site = where / "site"
    if (site / "latte").is_dir():
        return site
    source = where / "source"
    source.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "archive", rev], cwd=ROOT, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(source)], stdin=archive.stdout, check=True)
    archive.wait()
    print(f"building latte at {rev} into {site} ...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), f"--config-settings=build-dir={where / 'build'}", str(source)],
                   check=True)
    return site


def backend_directory(work: Path, site: Path, rev: str) -> Path:
    directory = install_backend(work / "backends", find_triton())
    (directory / BASELINE_BACKEND).mkdir(exist_ok=True)
    own = site.parent / "source" / "backend" / "model.py"
    (directory / BASELINE_BACKEND / "model.py").write_text(SHIM.format(rev=rev, site=str(site), model=str(own)))
    return directory


def run_model(name: str, args, work: Path, backends: Path) -> dict:
    load = wait_until_quiet(log=lambda line: print(f"  {line}", flush=True))
    print(f"{name}: load average at start {load:.2f}", flush=True)
    example = serving.IDENTITY if name == "identity" else CATALOG[name]
    setting = serving.SETTINGS[name]
    levels = [int(x) for x in (args.concurrency or setting.concurrency).split(",")]
    source = serving.model_file(example, work)
    repo = work / f"{name}-repo"
    names = {}
    for role, backend in (("current", "latte"), ("baseline", BASELINE_BACKEND)):
        names[role] = f"{name}_{role}"
        write_served_copy(repo, example, source, names[role], backend, max_batch_size=setting.max_batch_size,
                          dynamic_batching={"max_queue_delay_microseconds": setting.queue_delay_us},
                          instance_groups=[{"count": 1, "kind": "KIND_CPU"}])
    data = write_input_data(work / f"{name}-inputs.json", serving.samples_for(example, setting))
    throughput = {role: {str(level): [] for level in levels} for role in names}
    with TritonServer(repo, backend_directory=backends, log_path=work / f"{name}-tritonserver.log") as server:
        for round_ in range(args.rounds):
            for role in (("current", "baseline") if round_ % 2 == 0 else ("baseline", "current")):
                for level in levels:
                    point = serving.measure(names[role], server.grpc_url, level, data, args.measurement_ms)
                    throughput[role][str(level)].append(point.throughput)
                    print(f"  round {round_ + 1}: {role:8} at concurrency {level:3}: {point.throughput:9,.0f} infer/s",
                          flush=True)
    ratios = {level: [c / b for c, b in zip(throughput["current"][level], throughput["baseline"][level])]
              for level in throughput["current"]}
    return {"model": name, "load_average_at_start": load, "throughput": throughput,
            "ratios": {level: {"rounds": r, "median": statistics.median(r)} for level, r in ratios.items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, metavar="REV", help="the revision to compare with")
    parser.add_argument("--model", default="identity,sequence",
                        help=f"comma-separated, from {', '.join(serving.SETTINGS)} (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--concurrency", help="perf_analyzer concurrency levels (default: serving.py's per model)")
    parser.add_argument("--measurement-ms", type=int, default=2000, help="default: %(default)s")
    parser.add_argument("--label", default="", help="what the baseline is, in words, for the page")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    unknown = [m for m in models if m not in serving.SETTINGS]
    if unknown or args.rounds < 1:
        parser.error(f"unknown model(s) {unknown}" if unknown else "--rounds must be >= 1")
    site = build_baseline(args.baseline)
    started = utc_now()
    work = Path(tempfile.mkdtemp(prefix="latte-ab-"))
    backends = backend_directory(work, site, args.baseline)
    results = [run_model(name, args, work, backends) for name in models]
    print(f"\ncurrent / baseline ({args.baseline}), each round's ratio and their median:")
    for r in results:
        for level, ratio in r["ratios"].items():
            rounds = ", ".join(f"{x:.2f}" for x in ratio["rounds"])
            print(f"  {r['model']:9} concurrency {level:>3}: {ratio['median']:.2f}x  ({rounds})")
    figures = {"baseline": args.baseline, "label": args.label, "results": results}
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    record = new_results("revision-ab", "serving", f"Serving: the checked-out latte against {args.baseline}, one server",
                         command_line("benchmarks/revision_ab.py", argv), max(r["load_average_at_start"] for r in results),
                         HERE, started)
    print(f"wrote {write_summary(record, summarize(figures, args.rounds), HERE / 'results', figures)}")
    return 0


def summarize(figures: dict, rounds: int) -> dict:
    def medians(r, level):
        return " / ".join(f"{statistics.median(r['throughput'][role][level]):,.0f}" for role in ("current", "baseline"))
    rows = [[r["model"], level, f"{ratio['median']:.2f}x", " / ".join(f"{x:.2f}" for x in ratio["rounds"]),
             medians(r, level)] for r in figures["results"] for level, ratio in r["ratios"].items()]
    return dict(
        summary=(f"The same model file served by the checked-out latte and by latte at {figures['baseline']}"
                 f"{' (' + figures['label'] + ')' if figures.get('label') else ''} in one "
                 f"tritonserver, one instance each, perf_analyzer over gRPC, {rounds} interleaved rounds with the "
                 "order alternating: the machine's drift is in both, so the ratio is the code's."),
        tables=[Table("current / baseline throughput (median of the rounds' ratios; each round; median infer/s):",
                      ["model", "concurrency", "current / baseline", "rounds", "current / baseline infer/s"], rows)])


if __name__ == "__main__":
    sys.exit(main())
