"""PyTorch on the GPU with latte's arena against PyTorch's own caching allocator, on a
variable-shape inference loop: reserved memory, P99 per step, OOMs, fragmentation over time.

Each step draws a batch size (1..8) and a sequence length (lognormal, median 96, 1..2048),
makes the input on the device, runs the model in inference mode and copies the answer to the
host. Two models of different shape, built here (no downloads):
  * `sequence`: the bundled sequence encoder (one attention block, width 32), positions to 2048;
  * `encoder`: a larger transformer encoder (6 layers, width 512, 8 heads, FFN 2048).

Contenders, each in its own process (the allocator is chosen before CUDA is first used), in
interleaved rounds (`--rounds`: the same steps each round, the order turned by one):
  * `caching`: PyTorch's caching allocator as shipped;
  * `expandable`: the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, PyTorch's own
    answer to fragmentation;
  * `arena`: torch.cuda.memory.change_current_allocator(latte.memory.torch_pluggable_allocator()),
    every tensor a block of one BuddyArena;
  * `mempool`: the caching allocator for the weights, a torch.cuda.MemPool over the arena for
    everything the loop allocates;
  * `arena_paged`: the arena over the driver's pages (LATTE_CUDA_ARENA_PAGES=1, docs/memory.md):
    a large block is contiguous in addresses over any free pages, as with expandable segments.

Figures: the peak of live tensor bytes; what the allocator held at its peak (the caching
allocator's reserved segments; the arena's blocks, whose region is reserved once); held / live
over time; P50 and P99 of the step's wall time (with a synchronise); OOMs. After the first
round, every contender runs once more under one memory cap, 1.25x the caching allocator's peak
live bytes: the caching allocator through torch.cuda.set_per_process_memory_fraction, the arena
with that capacity.

    PYTHONPATH=build/gpu-site python3 benchmarks/gpu_allocator.py --models sequence --steps 30000 --json build/allocator.json
    PYTHONPATH=build/gpu-site python3 benchmarks/gpu_allocator.py --steps 2000 --cap-steps 1000    # a quick look

Needs a CUDA device and a build of latte with the CUDA toolkit: scripts/gpu_check.sh builds one
into build/gpu-site on the GPU machine (docs/gpu.md); with .venv's latte built with CUDA,
`.venv/bin/python benchmarks/gpu_allocator.py ...` works the same.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional

from latte.bench.budget import another_round_fits
from latte.bench.results import (Chart, Series, Table, Target, command_line, new_results, ratio_against,
                                 write_summary)

CONTENDERS = ("caching", "expandable", "arena", "mempool", "arena_paged")
ARENAS = ("arena", "arena_paged")   # every tensor a block of the arena
MODELS = ("sequence", "encoder")
MAX_LENGTH = 2048
MIB = 1 << 20


# ----------------------------------------------------------------------------------------------
# One contender in its own process.


def build_model(name: str):
    import torch

    torch.manual_seed(0)
    if name == "sequence":
        from latte.examples.models import SequenceEncoder

        model, vocab = SequenceEncoder(max_len=MAX_LENGTH), 1000
    else:
        layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.0, batch_first=True)
        model, vocab = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False), None
    return model.eval(), vocab


def make_input(torch, shape, vocab):
    batch, length = shape
    if vocab is not None:
        return torch.randint(1, vocab, (batch, length), device="cuda")
    return torch.randn(batch, length, 512, device="cuda")


def run_step(torch, model, shape, vocab) -> None:
    """One step of the loop: the input made on the device, the model, the answer to the host."""
    out = model(make_input(torch, shape, vocab))
    out.float().sum(dim=-1).cpu()


def shapes(steps: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(96), 1.0, steps), 1, MAX_LENGTH).astype(int)
    batches = rng.integers(1, 9, steps)
    return list(zip(batches.tolist(), lengths.tolist()))


def run_child(args) -> dict:
    import numpy as np
    import torch

    contender = args.contender
    if contender in ARENAS:
        from latte.memory import torch_pluggable_allocator

        torch.cuda.memory.change_current_allocator(torch_pluggable_allocator())
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    if args.cap and contender in ("caching", "expandable"):
        torch.cuda.set_per_process_memory_fraction(args.cap / total)
    model, vocab = build_model(args.model)
    model = model.cuda()
    pool = None
    if contender == "mempool":
        from latte.memory import torch_mem_pool

        pool = torch_mem_pool()

    def figures():
        """(live, held) bytes now, and their peaks so far."""
        if contender in ARENAS:
            from latte.memory import torch_arena_statistics

            s = torch_arena_statistics(0) or {}
            if s.get("page_bytes"):  # paged: the device's pages it holds, made at first touch and kept
                return s["live"], s["physical_held"], s["peak_live"], s["physical_held"]
            return s.get("live", 0), s.get("allocated", 0), s.get("peak_live", 0), s.get("peak_allocated", 0)
        # The caching allocator's own figures; with the MemPool they count the pool's segments,
        # which come from the arena, beside the weights' from the default pool.
        return (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
                torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved())

    plan = shapes(args.steps, args.seed)
    warmup = min(200, len(plan) // 10)
    times, ooms, timeline = [], 0, []
    sample_every = max(1, len(plan) // 20)
    context = torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext()
    started = time.perf_counter()
    with torch.inference_mode(), context:
        for step, shape in enumerate(plan):
            t0 = time.perf_counter()
            try:
                run_step(torch, model, shape, vocab)
            except (torch.OutOfMemoryError, RuntimeError) as error:
                # The arena's refusal reaches PyTorch's callers as a RuntimeError saying
                # "CUDA out of memory: latte device arena ...", not as OutOfMemoryError.
                if not isinstance(error, torch.OutOfMemoryError) and "out of memory" not in str(error):
                    raise
                ooms += 1
                torch.cuda.synchronize()
                continue
            torch.cuda.synchronize()
            if step >= warmup:
                times.append(time.perf_counter() - t0)
            if step % sample_every == 0 or step == len(plan) - 1:
                live, held, peak_live, peak_held = figures()
                timeline.append({"step": step, "live": live, "held": held, "peak_live": peak_live,
                                 "peak_held": peak_held})
    elapsed = time.perf_counter() - started
    live, held, peak_live, peak_held = figures()
    result = {"model": args.model, "contender": contender, "cap": args.cap, "steps": len(plan),
              "elapsed_s": elapsed, "ooms": ooms, "peak_live": peak_live, "peak_held": peak_held,
              "p50_ms": float(np.percentile(times, 50) * 1e3) if times else None,
              "p99_ms": float(np.percentile(times, 99) * 1e3) if times else None,
              "timeline": timeline}
    if contender in (*ARENAS, "mempool"):
        from latte.memory import torch_arena_check, torch_arena_statistics

        torch.cuda.synchronize()
        torch_arena_check(0)
        result["arena"] = torch_arena_statistics(0)
    return result


# ----------------------------------------------------------------------------------------------
# The parent: contenders interleaved, one process each.


def run_contender(model: str, contender: str, steps: int, seed: int, cap: int | None, arena_bytes: int) -> dict:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if contender == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if contender in (*ARENAS, "mempool"):
        env["LATTE_CUDA_ARENA_BYTES"] = str(cap or arena_bytes)
    env["LATTE_CUDA_ARENA_PAGES"] = "1" if contender == "arena_paged" else "0"
    command = [sys.executable, __file__, "--child", "--model", model, "--contender", contender,
               "--steps", str(steps), "--seed", str(seed)] + (["--cap", str(cap)] if cap else [])
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {"model": model, "contender": contender, "cap": cap, "error": tail[0]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def by_contender(results: list[dict], model: str) -> list[dict]:
    """One row per contender of MODEL's uncapped runs, in the order they first ran: the medians
    of its rounds (the rounds every contender ran; OOMs summed), the first round's timeline, and
    `p99_rounds`, each round's P99 over that round's caching allocator's (`p99_vs`: their
    median; none without a caching run in any of its rounds)."""
    every = [r for r in results if r["model"] == model and not r.get("cap")]
    contenders = {r["contender"] for r in every}
    ran = {r.get("round", 0) for r in every}
    # A round the budget cut short would pair some contenders' medians with others' rounds.
    whole = {k for k in ran if {r["contender"] for r in every if r.get("round", 0) == k} == contenders} or ran
    runs = [r for r in every if r.get("round", 0) in whole and "error" not in r]
    caching = {r.get("round", 0): r["p99_ms"] for r in runs if r["contender"] == "caching"}
    rows = []
    for contender in dict.fromkeys(r["contender"] for r in runs):
        mine = [r for r in runs if r["contender"] == contender]
        ratios = [r["p99_ms"] / caching[r.get("round", 0)] for r in mine
                  if caching.get(r.get("round", 0)) and r["p99_ms"]]
        row = dict(mine[0])
        row.update({key: statistics.median(r[key] for r in mine)
                    for key in ("peak_live", "peak_held", "p50_ms", "p99_ms")})
        row.update(rounds=len(mine), ooms=sum(r["ooms"] for r in mine), p99_rounds=ratios,
                   p99_vs=statistics.median(ratios) if ratios else None)
        rows.append(row)
    return rows


def table(results: list[dict], model: str) -> list[str]:
    rows = by_contender(results, model)
    base = next((r for r in rows if r["contender"] == "caching"), None)
    lines = [f"  {'contender':<11} {'peak live':>10} {'held':>10} {'held/live':>9} {'vs caching':>10} "
             f"{'P50 ms':>7} {'P99 ms':>7} {'P99 vs':>7} {'OOMs':>5}  P99 vs caching, each round"]
    for r in results:
        if r["model"] == model and not r.get("cap") and "error" in r:
            lines.append(f"  {r['contender']:<11} failed: {r['error']}")
    for r in rows:
        lines.append(
            f"  {r['contender']:<11} {r['peak_live'] / MIB:>8.1f}Mi {r['peak_held'] / MIB:>8.1f}Mi "
            f"{r['peak_held'] / max(1, r['peak_live']):>8.2f}x {ratio(r['peak_held'], base and base['peak_held']):>10} "
            f"{r['p50_ms']:>7.3f} {r['p99_ms']:>7.3f} {ratio_against(r['p99_vs']):>7} {r['ooms']:>5}  "
            + ", ".join(f"{v:.2f}" for v in r["p99_rounds"]))
    over_time = [f"  held/live over time (quarters of the run):"]
    for r in rows:
        if "error" in r or not r["timeline"]:
            continue
        points = r["timeline"]
        marks = [points[min(len(points) - 1, round(q * (len(points) - 1)))] for q in (0.25, 0.5, 0.75, 1.0)]
        over_time.append(f"    {r['contender']:<11} " + "  ".join(
            f"{m['peak_held'] / max(1, m['peak_live']):.2f}x@{m['step']}" for m in marks))
    capped = [r for r in results if r["model"] == model and r.get("cap")]
    if capped:
        ratio_of_live = capped[0]["cap"] / max(1, base["peak_live"]) if base else float("nan")
        lines.append(f"  under a cap of {capped[0]['cap'] / MIB:.0f} MiB ({ratio_of_live:.2f}x the caching allocator's peak live):")
        for r in capped:
            lines.append(f"    {r['contender']:<11} " + (f"failed: {r['error']}" if "error" in r else
                                                         f"OOMs {r['ooms']} of {r['steps']} steps, held "
                                                         f"{r['peak_held'] / MIB:.1f} MiB, P99 {r['p99_ms']:.3f} ms"))
    return lines + over_time


HERE = Path(__file__).resolve().parent


class PagedFigures(NamedTuple):
    """The paged arena on one model, against the caching allocator."""
    model: str
    held: float      # peak held, uncapped, over the caching allocator's
    p99: Optional[float]  # P99 per step over the caching allocator's (the median of the rounds' ratios)
    capped_ooms: int
    others: str      # the other contenders' OOMs under the same cap
    stats: dict      # the arena's own figures (map and unmap calls)
    steps: int
    held_live: float          # its own peak held over its peak live
    caching_held_live: float  # the caching allocator's, the same way


def summarize(results: list[dict], device: str, steps: int, name: str = "gpu-allocator") -> dict:
    """The page's view of a run: per model, the contenders' table and memory held over the run;
    the targets against the caching allocator."""
    tables, charts, held, p99, oom, paged = [], [], [], [], [], []
    for model in dict.fromkeys(r["model"] for r in results):
        rows = by_contender(results, model)
        base = next((r for r in rows if r["contender"] == "caching"), None)
        if base is None:
            continue
        rounds = max(r["rounds"] for r in rows)
        several = rounds > 1
        tables.append(Table(f"{model}, {steps:,} steps per contender"
                            + (f", medians of {rounds} interleaved rounds:" if several else ":"),
                            ["contender", "peak live", "held", "held / live", "held vs caching", "P50 step",
                             "P99 step", "P99 vs caching", "OOMs" + (" (all rounds)" if several else "")]
                            + (["P99 vs caching, each round"] if several else []),
                            [[r["contender"], f"{r['peak_live'] / MIB:.1f} MiB", f"{r['peak_held'] / MIB:.1f} MiB",
                              f"{r['peak_held'] / max(1, r['peak_live']):.2f}x", ratio(r["peak_held"], base["peak_held"]),
                              f"{r['p50_ms']:.3f} ms", f"{r['p99_ms']:.3f} ms", ratio_against(r["p99_vs"]), str(r["ooms"])]
                             + ([", ".join(f"{v:.2f}" for v in r["p99_rounds"])] if several else [])
                             for r in rows]))
        # Named by the run as well when it is a run of some models, whose file sits beside the full run's.
        chart = f"gpu-{model}-memory-held" if name == "gpu-allocator" else f"{name}-{model}-memory-held"
        charts.append(Chart(chart, f"{model} on {device}: memory held over the run",
                            "step", "held (MiB)",
                            [Series(r["contender"], [(m["step"], round(m["held"] / MIB, 1)) for m in r["timeline"]])
                             for r in rows if r["timeline"]]))
        arena = next((r for r in rows if r["contender"] == "arena"), None)
        if arena:
            held.append((model, arena["peak_held"] / base["peak_held"]))
            p99.append((model, arena["p99_vs"]))
        capped = {r["contender"]: r for r in results if r["model"] == model and r.get("cap") and "error" not in r}
        if capped:
            cap, steps_capped = next((r["cap"], r["steps"]) for r in capped.values())
            tables.append(Table(f"{model} under a cap of {cap / MIB:.0f} MiB ({cap / max(1, base['peak_live']):.2f}x "
                                f"the caching allocator's peak live), {steps_capped:,} steps:",
                                ["contender", "OOMs", "held", "P99 step"],
                                [[contender, str(r["ooms"]), f"{r['peak_held'] / MIB:.1f} MiB", f"{r['p99_ms']:.3f} ms"]
                                 for contender, r in capped.items()]))
        if "arena" in capped and "caching" in capped:
            oom.append((model, capped["arena"]["ooms"], capped["caching"]["ooms"]))
        pages = next((r for r in rows if r["contender"] == "arena_paged"), None)
        if pages and "arena_paged" in capped:
            others = ", ".join(f"{name} {capped[name]['ooms']}" for name in ("caching", "expandable") if name in capped)
            paged.append(PagedFigures(model, pages["peak_held"] / base["peak_held"], pages["p99_vs"],
                                      capped["arena_paged"]["ooms"], others, pages.get("arena", {}), pages["steps"],
                                      pages["peak_held"] / max(1, pages["peak_live"]),
                                      base["peak_held"] / max(1, base["peak_live"])))
    targets = []
    if held:
        ok = all(v <= 0.8 for _, v in held)
        targets.append(Target("arena-backed torch holds ≤ 0.8x the caching allocator's reserved memory",
                              ", ".join(f"{m} {ratio_against(v, 0.8)}" for m, v in held), "yes" if ok else "no"))
    if p99:
        passed = [v is not None and v <= 1.0 for _, v in p99]
        targets.append(Target("P99 per step ≤ 1.0x the caching allocator's", ", ".join(f"{m} {ratio_against(v)}" for m, v in p99),
                              "yes" if all(passed) else ("partly" if any(passed) else "no")))
    if oom:
        ok = all(a <= c for _, a, c in oom)
        targets.append(Target("under a cap, no more OOMs than the caching allocator",
                              ", ".join(f"{m}: arena {a}, caching {c}" for m, a, c in oom), "yes" if ok else "no",
                              why="" if ok else "the plain arena's free space is in power-of-two pieces, and the "
                                  "caching allocator under a cap frees its cache and retries; the paged arena's "
                                  "blocks are stitched from any free pages" + (" (its targets below)" if paged else "")))
    if paged:  # the paged arena's own targets (docs/memory.md, On a CUDA device)
        targets.append(Target("paged arena: 0 OOMs under the cap (caching and expandable alongside)",
                              "; ".join(f"{p.model}: {p.capped_ooms} ({p.others})" for p in paged),
                              "yes" if all(p.capped_ooms == 0 for p in paged) else "no"))
        slower = [p for p in paged if p.p99 is not None and p.p99 > 1.0]
        unpaired = [p.model for p in paged if p.p99 is None]
        why = []
        if unpaired:
            why.append(f"no round of {', '.join(unpaired)} had a caching run to compare its P99 with")
        if any(p.held > 0.5 for p in paged):
            why.append("idle pages stay mapped up to half the pages in use (a device's idle_share 2), so that few "
                       "blocks wait for the device's kernels while pages are unmapped: a smaller share holds less "
                       "and waits more (docs/memory.md, On a CUDA device); held ≤ 0.5x needs the caching "
                       "allocator to hold at least twice the paged arena's own held / live: " + ", ".join(
                           f"{p.model} caching {p.caching_held_live:.2f}x, paged {p.held_live:.2f}x"
                           for p in paged if p.held > 0.5))
        if slower:
            why.append("a step that needs new pages makes a few driver calls per page, and one that unmaps waits "
                       "for the device's kernels first: " + ", ".join(
                           f"{p.model} {p.stats.get('map_calls', 0):,} map and {p.stats.get('unmap_calls', 0):,} "
                           f"unmap calls in {p.steps:,} steps" for p in slower))
        targets.append(Target("paged arena: held ≤ 0.5x and P99 ≤ 1.0x the caching allocator's",
                              ", ".join(f"{p.model} {ratio_against(p.held, 0.5)} / {ratio_against(p.p99)}" for p in paged),
                              "no" if why else "yes", why="; ".join(why)))
    return dict(summary=(f"Each step draws a batch and a lognormal length, makes the input on the device, runs the "
                         "model in inference mode and copies the answer to the host; \"held\" is what the allocator "
                         "held at its peak. One process per contender and round; each round runs the same "
                         "steps, the contenders' order turned by one, and P99 against the caching allocator is the "
                         "median of each round's ratio. The capped runs go once, after the first round."),
                targets=targets, tables=tables, charts=charts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--steps", type=int, default=100_000, help="steps per contender and model, each round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="uncapped rounds, the contenders' order turned by one each round; medians")
    parser.add_argument("--cap-steps", type=int, default=20_000, help="steps of each capped run (0: none)")
    parser.add_argument("--cap-ratio", type=float, default=1.25, help="the cap, as a multiple of caching's peak live")
    parser.add_argument("--seed", type=int, default=20261125)
    parser.add_argument("--arena-bytes", type=int, default=16 << 30, help="the arena's capacity when uncapped")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="seconds at most: no run starts that would pass them, at the average run's length "
                             "(0: no limit)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--results-dir", type=Path, default=HERE / "results",
                        help="where gpu-allocator.json, the page's input, goes")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--cap", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args)))
        return 0

    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    import torch

    if not torch.cuda.is_available():
        print("gpu_allocator: needs a CUDA device (torch sees none)", file=sys.stderr)
        return 2
    models = [m for m in args.models.split(",") if m]
    contenders = [c for c in args.contenders.split(",") if c]
    for name in models + contenders:
        if name not in MODELS + CONTENDERS:
            parser.error(f"unknown model or contender {name!r}; models: {', '.join(MODELS)}; "
                         f"contenders: {', '.join(CONTENDERS)}")
    # A run of some of the models keeps a file of its own beside the run of all of them.
    name = "gpu-allocator" if set(models) == set(MODELS) else "-".join(["gpu-allocator", *models])
    title = "GPU: PyTorch with latte's arena against the caching allocator, variable shapes"
    record = new_results(name, "gpu", title + ("" if name == "gpu-allocator" else f" ({', '.join(models)})"),
                         command_line("benchmarks/gpu_allocator.py", None, python="PYTHONPATH=build/gpu-site python3"),
                         os.getloadavg()[0], HERE)
    print(f"device {torch.cuda.get_device_name(0)}, torch {torch.__version__}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}, {platform.node()}; {args.steps} steps per contender, {args.rounds} "
          "round(s)", flush=True)
    results = []

    def save():  # after every run, so that a run cut short still leaves its figures
        if args.json:
            args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                                             "steps": args.steps, "cap_steps": args.cap_steps,
                                             "results": results}, indent=1))

    since, spent = time.monotonic(), False

    def fits(runs: int = 1) -> bool:
        nonlocal spent
        if not spent and not another_round_fits(since, len(results), args.budget_s, more=runs):
            print(f"  budget of {args.budget_s:.0f} s spent: the runs left are left out", flush=True)
            spent = True
        return not spent

    def run_round(model: str, round_: int) -> None:
        # The same steps each round (one seed): what differs between rounds is the machine.
        for contender in contenders[round_ % len(contenders):] + contenders[:round_ % len(contenders)]:
            if not fits():
                return
            results.append({**run_contender(model, contender, args.steps, args.seed, None, args.arena_bytes),
                            "round": round_})
            print(f"  {model}/{contender}, round {round_ + 1}: "
                  + json.dumps({k: v for k, v in results[-1].items() if k != 'timeline'}), flush=True)
            save()

    def run_capped(model: str) -> None:
        base = next((r for r in results if r["model"] == model and r["contender"] == "caching" and "error" not in r),
                    None)
        if not args.cap_steps or base is None:
            return
        cap = int(base["peak_live"] * args.cap_ratio) // (2 * MIB) * (2 * MIB) + 2 * MIB
        for contender in contenders:
            if not fits():
                return
            results.append(run_contender(model, contender, args.cap_steps, args.seed + 1, cap, args.arena_bytes))
            save()

    # Every model's first round, then every model's capped runs, then the further rounds, each
    # started only where all of it fits: a budget that runs short costs further rounds first.
    for model in models:
        run_round(model, 0)
    for model in models:
        run_capped(model)
    for round_ in range(1, args.rounds):
        if not fits(len(models) * len(contenders)):
            break
        for model in models:
            run_round(model, round_)
    for model in models:
        print(f"\n{model}:")
        print("\n".join(table(results, model)), flush=True)
    record.machine += f", {torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    summary = summarize(results, torch.cuda.get_device_name(0), args.steps, name)
    print(f"wrote {write_summary(record, summary, args.results_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
