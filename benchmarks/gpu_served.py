"""A GPU instance's memory under tritonserver: latte's arena against PyTorch's caching allocator.

    python3 benchmarks/gpu_served.py [--budget-s 100] [--windows 4] [--window-ms 1000]
                                     [--kind KIND_GPU] [--results-dir benchmarks/results]

One tritonserver serves the sequence encoder with positions to 2,048 (TorchScript; attention, so
the memory a batch needs grows with the square of its longest member) as four latte models,
each on one KIND_GPU instance, which is a process of its own:

- caching: PyTorch's caching allocator (`device_allocator: caching`);
- expandable: the same with expandable_segments;
- arena: latte's buddy arena as PyTorch's pluggable allocator (`device_allocator: arena`, its
  capacity `device_arena_bytes`, 1 GiB);
- arena_paged: the same arena over the driver's pages (`arena_pages: true`);
- fp16: the caching allocator with `precision: fp16`, admitted only through the accuracy gate.

First each one's answers to the same 12 requests are compared with the model file run on the
CPU in fp32 (relative L2 error; fp32 contenders within 1e-4, fp16 within the gate's 0.02).
Then perf_analyzer (gRPC, concurrency 8) drives them in windows, contenders in rotated order
within each window, requests of lognormal lengths (median 96, 1..2,048): P50 and P99 per window,
and after each window what each instance holds, from its own figures (latte_device_memory_bytes:
the caching allocator's reserved segments, the arena's blocks handed out) and from nvidia-smi
(the process's device memory: its CUDA context, and all of the arena's capacity). Windows stop
where another would pass --budget-s. P99 in the first window against the last shows whether an
allocator slows as the run goes on.

--kind KIND_CPU rehearses the same steps without a GPU: the caching contender alone, on the CPU.
The figures replace benchmarks/results/gpu-served-memory.json, rendered by
`.venv/bin/python -m latte.bench.page` in the page's GPU section.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from latte.bench import cpu
from latte.bench.budget import rounds_within
from latte.bench.lengths import LengthDistribution
from latte.bench.prometheus_scrape import scrape, total
from latte.bench.quiet import wait_until_quiet
from latte.bench.results import (Table, Target, command_line, new_results, paired_ratios, ratio_against, utc_now,
                                 write_summary)
from latte.bench.triton_stats import fetch_stats
from latte.examples import CATALOG, FORMATS, write_served_copy
from latte.triton import TritonServer
from latte.triton.perf import run_perf_analyzer, write_input_data

HERE = Path(__file__).resolve().parent
MAX_LENGTH = 2048
LENGTHS = "lognormal:median=96,sigma=1.0"
CONCURRENCY = 8
MIB = 1 << 20
CONTENDERS = {
    "caching": {},
    "expandable": {"device_allocator": "expandable"},
    "arena": {"device_allocator": "arena", "device_arena_bytes": str(1 << 30)},
    # The same arena over the driver's pages (docs/memory.md, On a CUDA device).
    "arena_paged": {"device_allocator": "arena", "device_arena_bytes": str(1 << 30), "arena_pages": "true"},
    "fp16": {"precision": "fp16"},
}
TOLERANCE = {"fp16": 0.02}      # the accuracy gate's default; fp32 contenders: FP32_TOLERANCE
FP32_TOLERANCE = 1e-4
TARGET_HELD = 0.5               # the arena's peak held / the caching allocator's
TARGET_P99 = 1.0


def long_sequence_example():
    return dataclasses.replace(CATALOG["sequence"], name="sequence_long", max_sequence_length=MAX_LENGTH,
                               max_batch_size=8)


def build_model_file(work: Path) -> Path:
    """The sequence encoder with positions to MAX_LENGTH, traced to TorchScript on the CPU."""
    import torch

    from latte.examples.models import SequenceEncoder

    torch.manual_seed(0)
    module = SequenceEncoder(max_len=MAX_LENGTH).eval()
    path = work / "model" / FORMATS["torchscript"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.jit.trace(module, (torch.randint(1, 1000, (2, 7)),)).save(str(path))
    return path


def write_contenders(repo: Path, source: Path, roles: List[str], kind: str) -> Dict[str, str]:
    example = long_sequence_example()
    names = {}
    for role in roles:
        names[role] = f"sequence_long_{role}"
        write_served_copy(repo, example, source, names[role], "latte", parameters=CONTENDERS[role],
                          instance_groups=[{"count": 1, "kind": kind}],
                          dynamic_batching={"max_queue_delay_microseconds": 500})
    return names


def infer_http(http_url: str, model: str, tokens: np.ndarray) -> np.ndarray:
    """One request through Triton's HTTP/REST JSON protocol (no client library needed)."""
    body = {"inputs": [{"name": "tokens", "shape": [1, len(tokens)], "datatype": "INT64",
                        "data": tokens.tolist()}]}
    request = urllib.request.Request(f"http://{http_url}/v2/models/{model}/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        output = json.loads(response.read())["outputs"][0]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def answer_errors(http_url: str, names: Dict[str, str], source: Path) -> Dict[str, float]:
    """Each contender's worst relative L2 error against the model file in fp32 on the CPU."""
    import torch

    reference = torch.jit.load(str(source), map_location="cpu").eval()
    rng = np.random.default_rng(17)
    lengths = [1, 5, 37, 96, 150, 300, 511, 700, 1024, 1500, 2000, MAX_LENGTH]
    worst = {}
    for role, name in names.items():
        errors = []
        for n in lengths:
            tokens = rng.integers(1, 1000, n, dtype=np.int64)
            with torch.inference_mode():
                want = reference(torch.from_numpy(tokens[None])).numpy()
            try:
                got = infer_http(http_url, name, tokens)
            except OSError as exc:  # an HTTP error too: the contender is reported, the others measured
                print(f"  {role}: a request of {n} tokens failed: {exc}", flush=True)
                errors.append(float("inf"))
                continue
            errors.append(float(np.linalg.norm(got - want) / max(1e-12, np.linalg.norm(want))))
        worst[role] = max(errors)
    return worst


def smi_memory_mib() -> Dict[int, float]:
    """Device memory per process (MiB) from nvidia-smi; {} where it is absent or says nothing."""
    if shutil.which("nvidia-smi") is None:
        return {}
    done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=20)
    found = {}
    for line in done.stdout.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip().isdigit() and used.strip().replace(".", "", 1).isdigit():
            found[int(pid)] = float(used)
    return found


def memory_now(server, names: Dict[str, str]) -> Dict[str, dict]:
    """Each contender's latte_device_memory_bytes by state, its failures, and nvidia-smi's MiB."""
    time.sleep(1.2)  # latte publishes its gauges once a second
    values = scrape(server.metrics_url)
    smi = smi_memory_mib()
    found = {}
    for role, name in names.items():
        states = {state: total(values, "latte_device_memory_bytes", model=name, state=state)
                  for state in ("held", "live", "peak_held", "peak_live", "capacity")}
        states["failures"] = total(values, "latte_device_arena_failures", model=name)
        pids = cpu.model_stub_pids(server.process.pid, name)
        states["smi_mib"] = sum(smi[p] for p in pids if p in smi) if smi and pids else None
        found[role] = states
    return found


def run(args, work: Path) -> dict:
    load_at_start = wait_until_quiet(log=lambda line: print(f"  {line}", flush=True))
    started = utc_now()
    roles = list(CONTENDERS) if args.kind == "KIND_GPU" else ["caching"]
    source = build_model_file(work)
    names = write_contenders(work / "repo", source, roles, args.kind)
    rng = np.random.default_rng(5)
    lengths = LengthDistribution.parse(LENGTHS).sample(rng, 512, MAX_LENGTH)
    data = write_input_data(work / "inputs.json", [{"tokens": rng.integers(1, 1000, int(n), dtype=np.int64)}
                                                   for n in lengths])
    windows: Dict[str, List[dict]] = {role: [] for role in roles}
    load_errors = {}
    # A contender that fails to load is reported with its reason; the others are still measured.
    with TritonServer(work / "repo", log_path=work / "tritonserver.log", keep_going=True) as server:
        for model, reason in server.failed_models():
            role = next(r for r, n in names.items() if n == model)
            load_errors[role] = reason
            print(f"  {role} did not load: {reason}", flush=True)
            del names[role], windows[role]
            roles.remove(role)
        if not names:
            print("  no contender loaded: nothing to measure", flush=True)
            return {"started": started, "load_average_at_start": load_at_start, "kind": args.kind,
                    "device": device_name(), "concurrency": CONCURRENCY, "lengths": LENGTHS,
                    "window_ms": args.window_ms, "answer_errors": {}, "failed_requests": {}, "windows": {},
                    "load_errors": load_errors}
        errors = answer_errors(server.http_url, names, source)
        print("  answers against fp32 on the CPU (worst relative L2): "
              + ", ".join(f"{role} {e:.1e}" for role, e in errors.items()), flush=True)
        for window in rounds_within(args.windows, args.budget_s, unit="window"):
            order = roles[window % len(roles):] + roles[:window % len(roles)]
            for role in order:
                (point,) = run_perf_analyzer(names[role], server.grpc_url, concurrency=[CONCURRENCY], input_data=data,
                                             measurement_ms=args.window_ms, max_trials=6, stability_percentage=100)
                windows[role].append(point.as_dict())
            for role, figures in memory_now(server, names).items():
                windows[role][-1]["memory"] = figures
                print(f"  window {window + 1}: {role:10} P50 {windows[role][-1]['p50_ms']:7.2f} ms  P99 "
                      f"{windows[role][-1]['p99_ms']:7.2f} ms  {windows[role][-1]['throughput']:8.1f} infer/s  "
                      f"held {(figures['peak_held'] or 0) / MIB:7.1f} MiB  nvidia-smi {figures['smi_mib']} MiB",
                      flush=True)
        failed = {role: fetch_stats(server.http_url, name).fail_count for role, name in names.items()}
    return {"started": started, "load_average_at_start": load_at_start, "kind": args.kind, "device": device_name(),
            "concurrency": CONCURRENCY, "lengths": LENGTHS, "window_ms": args.window_ms,
            "answer_errors": errors, "failed_requests": failed, "windows": windows, "load_errors": load_errors}


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    except ImportError:
        pass
    return "no GPU"


def contender_figures(r: dict, role: str) -> dict:
    ws = r["windows"][role]
    last_memory = ws[-1]["memory"] if ws else {}
    return {"peak_held": last_memory.get("peak_held"), "peak_live": last_memory.get("peak_live"),
            "held_at_end": last_memory.get("held"), "live_at_end": last_memory.get("live"),
            "smi_mib": max([w["memory"]["smi_mib"] for w in ws if w["memory"].get("smi_mib")] or [None]) if ws else None,
            "p50_ms": statistics.median(w["p50_ms"] for w in ws) if ws else None,
            "p99_first": ws[0]["p99_ms"] if ws else None, "p99_last": ws[-1]["p99_ms"] if ws else None,
            "p99_ms": statistics.median(w["p99_ms"] for w in ws) if ws else None,
            "throughput": statistics.median(w["throughput"] for w in ws) if ws else None,
            "arena_failures": last_memory.get("failures"), "failed_requests": r["failed_requests"][role],
            "answer_error": r["answer_errors"][role]}


def window_ratios(r: dict, role: str, base: str = "caching") -> list:
    """ROLE's P99 in each window over the base's in the same window: the contenders are rotated
    within a window, so a window's ratio compares them on the same minute of the machine."""
    return paired_ratios(r["windows"].get(role, []), r["windows"].get(base, []), "p99_ms")


def summarize(r: dict) -> dict:
    roles = list(r["windows"])
    figures = {role: contender_figures(r, role) for role in roles}
    base = figures.get("caching") or {"peak_held": None, "peak_live": None, "p99_ms": None, "held_at_end": None}

    def mib(value):
        return f"{value / MIB:,.1f}" if value else "-"

    def ratio(value, of):
        return f"{value / of:.2f}x" if value and of else "-"

    def paired(role):  # the median of the windows' own ratios
        ratios = window_ratios(r, role)
        return statistics.median(ratios) if ratios else None

    rows = [[role, mib(f["peak_live"]), mib(f["peak_held"]), ratio(f["peak_held"], base["peak_held"]),
             f"{mib(f['held_at_end'])} / {mib(f['live_at_end'])}",
             f"{f['smi_mib']:,.0f}" if f["smi_mib"] else "-", f"{f['p50_ms']:.2f}", f"{f['p99_first']:.2f}",
             f"{f['p99_last']:.2f}", ratio_against(paired(role)), f"{f['throughput']:,.0f}",
             str(f["failed_requests"]), f"{f['answer_error']:.1e}"] for role, f in figures.items()]
    windows = max((len(ws) for ws in r["windows"].values()), default=0)
    targets = [Target(f"{role}: answers within {TOLERANCE.get(role, FP32_TOLERANCE):g} relative L2 of fp32 on the CPU",
                      f"{figures[role]['answer_error']:.1e}",
                      "yes" if figures[role]["answer_error"] <= TOLERANCE.get(role, FP32_TOLERANCE) else "no")
               for role in roles]
    if "arena" in r.get("load_errors", {}):
        targets.append(Target("arena: loads and serves under the server", "did not load", "no",
                              why=r["load_errors"]["arena"][:200]))
    if "arena" in figures:
        arena = figures["arena"]
        held = arena["peak_held"] / base["peak_held"] if arena["peak_held"] and base["peak_held"] else None
        caching_overhead = base["peak_held"] / base["peak_live"] if base.get("peak_live") and base["peak_held"] else None
        p99 = paired("arena")
        of_medians = arena["p99_ms"] / base["p99_ms"] if arena["p99_ms"] and base["p99_ms"] else None
        targets += [Target(f"arena: peak held ≤ {TARGET_HELD}x the caching allocator's (their own figures)",
                           f"{held:.2f}x" if held else "-", "yes" if held and held <= TARGET_HELD else "no",
                           why=(f"served, the caching allocator held only {caching_overhead:.2f}x its peak live "
                                "bytes and did not grow across the windows (batches of at most 8, padded to "
                                "bucket edges, repeat the same block sizes); the arena holds what is live, so it "
                                "can save no more than that overhead. nvidia-smi counts the arena's whole "
                                "capacity (device_arena_bytes) and each process's CUDA context"
                                + steady_state(base, arena) if caching_overhead else "")),
                    Target(f"arena: P99 ≤ {TARGET_P99}x the caching allocator's (median of the windows' ratios)",
                           ratio_against(p99, TARGET_P99) + " (windows " + ", ".join(f"{v:.2f}" for v in window_ratios(r, "arena"))
                           + (f"; ratio of medians {of_medians:.2f}x)" if of_medians else ")") if p99 else "-",
                           "yes" if p99 and p99 <= TARGET_P99 else "no"),
                    Target("arena: no request fails and no allocation is refused",
                           f"{arena['failed_requests']} failed, {int(arena['arena_failures'] or 0)} refused",
                           "yes" if not arena["failed_requests"] and not arena["arena_failures"] else "no")]
    return dict(
        summary=(f"On {r['device']}: the sequence encoder (positions to {MAX_LENGTH:,}) served by latte on "
                 f"{r['kind']} instances, one process each; perf_analyzer over gRPC at concurrency "
                 f"{r['concurrency']}, lengths {r['lengths']}, {windows} windows of 3 x {r['window_ms']} ms, contenders "
                 "rotated within each window. \"held\" is the allocator's own figure at its peak (the caching "
                 "allocator's reserved segments, the arena's blocks handed out); nvidia-smi's is the whole process "
                 "on the device (its CUDA context, and all of the arena's capacity)."),
        targets=targets,
        tables=[Table("Per contender (MiB; ms; P99 first and last: the first window's and the last's; P99 vs "
                      "caching: the median of each window's ratio):",
                      ["contender", "peak live", "peak held", "held vs caching", "held / live at the end",
                       "nvidia-smi", "P50", "P99 first",
                       "P99 last", "P99 vs caching", "infer/s", "failed", "answers vs CPU fp32"], rows)],
        notes=[f"{role} did not load: {reason}" for role, reason in r.get("load_errors", {}).items()]
        + peak_notes(r))


def steady_state(caching: dict, arena: dict) -> str:
    """Between requests: what each allocator kept, from the last window's figures."""
    if not caching.get("held_at_end") or not arena.get("held_at_end"):
        return ""
    return (f". Between requests (after the last window) the caching allocator kept "
            f"{caching['held_at_end'] / MIB:,.1f} MiB reserved for {caching['live_at_end'] / MIB:,.1f} MiB live, "
            f"the arena {arena['held_at_end'] / MIB:,.1f} MiB of blocks, inside its capacity")


def peak_notes(r: dict) -> List[str]:
    """Whether the peaks moved after the first window: a peak already there after the first one
    was most likely set at load, where warm-up runs the largest batch at the longest length."""
    steady = [role for role, ws in r["windows"].items()
              if ws and ws[0]["memory"].get("peak_held") == ws[-1]["memory"].get("peak_held")]
    if not steady or len(steady) != len(r["windows"]):
        return []
    return ["No contender's peak held moved after the first window: each was reached at load or in the "
            "first seconds (warm-up runs the largest batch at the longest length), and served traffic "
            "added none; the comparison is of what each allocator holds for the same peak."]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=100.0,
                        help="seconds of windows: none starts that would pass it (default: %(default)s)")
    parser.add_argument("--windows", type=int, default=4, help="at most (default: %(default)s)")
    parser.add_argument("--window-ms", type=int, default=1000,
                        help="perf_analyzer's measurement interval; a window is three (default: %(default)s)")
    parser.add_argument("--kind", choices=("KIND_GPU", "KIND_CPU"), default="KIND_GPU")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where gpu-served-memory.json goes (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.windows < 1:
        parser.error("--windows must be >= 1")
    result = run(args, Path(tempfile.mkdtemp(prefix="latte-gpu-served-")))
    record = new_results("gpu-served-memory", "gpu", "GPU served: the arena against the caching allocator under "
                         "tritonserver, and fp16 through the accuracy gate",
                         command_line("benchmarks/gpu_served.py", argv, python="python3"),
                         result["load_average_at_start"], HERE, result["started"])
    print(f"wrote {write_summary(record, summarize(result), args.results_dir, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
