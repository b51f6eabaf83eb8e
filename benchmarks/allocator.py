"""Allocator benchmarks for latte.memory.BuddyArena; every ratio is measured in this run.

    .venv/bin/python benchmarks/allocator.py [--quick] [--results-dir benchmarks/results]

1. alloc + touch every page + free from Python, on a serving-like lognormal mix of sizes
   (4 KiB..64 MiB) and on fixed sizes: BuddyArena vs numpy.empty, torch.empty, malloc (ctypes).
2. C++ small-path microbenchmark: ns per allocate/free pair (vs malloc/free).
3. C++ trace replay of a variable-length serving trace (>= 1M operations): BuddyArena vs a
   model of PyTorch's CUDA caching allocator vs glibc malloc's RSS.

The figures, summarised, replace benchmarks/results/allocator.json, from which
docs/benchmarks.md is rendered (`.venv/bin/python -m latte.bench.page`).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from latte.bench.quiet import wait_until_quiet
from latte.bench.results import Table, Target, command_line, new_results, write_summary
from latte.memory import BuddyArena

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "cpp-bench"
KiB, MiB = 1 << 10, 1 << 20
PAGE = 4096

torch.set_num_threads(1)  # nothing here computes; keep torch from spawning its pool

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]


class _RawBuffer:
    """Exposes malloc'd memory to numpy without copying (same touch code for everyone)."""

    def __init__(self, address: int, nbytes: int) -> None:
        self.__array_interface__ = {"data": (address, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}


def _touch(view: np.ndarray) -> None:
    view[::PAGE] = 1


def run_arena(arena: BuddyArena, sizes) -> None:
    for n in sizes:
        _touch(arena.empty(n, np.uint8))  # the block returns when the array dies


def run_numpy(sizes) -> None:
    for n in sizes:
        _touch(np.empty(n, np.uint8))


def run_torch(sizes) -> None:
    for n in sizes:
        _touch(torch.empty(n, dtype=torch.uint8).numpy())


def run_malloc(sizes) -> None:
    for n in sizes:
        p = _libc.malloc(n)
        _touch(np.asarray(_RawBuffer(p, n)))
        _libc.free(p)


def best_us_per_op(contenders: dict, sizes, rounds: int) -> dict:
    """Best-of-rounds time per op; contenders take turns within each round so that a burst
    of load on this shared machine hits all of them alike."""
    best = {name: float("inf") for name in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn(sizes)
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: t / len(sizes) * 1e6 for name, t in best.items()}


def python_benchmarks(quick: bool) -> dict:
    rng = np.random.default_rng(2026)
    n_mix = 150 if quick else 400
    mix = np.clip(rng.lognormal(np.log(512 * KiB), 1.5, n_mix), 4 * KiB, 64 * MiB).astype(int).tolist()
    workloads = {"lognormal mix 4 KiB..64 MiB": mix}
    for size in (4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB):
        count = 100 if size >= 16 * MiB else 1000
        workloads[f"fixed {size // KiB} KiB"] = [size] * (count // (4 if quick else 1))
    arena = BuddyArena(256 * MiB)
    paged = BuddyArena(256 * MiB, paged=True)
    contenders = {
        "BuddyArena": lambda s: run_arena(arena, s),
        "paged BuddyArena": lambda s: run_arena(paged, s),
        "numpy.empty": run_numpy,
        "torch.empty": run_torch,
        "malloc (ctypes)": run_malloc,
    }
    results = {}
    for name, sizes in workloads.items():
        timings = best_us_per_op(contenders, sizes, rounds=3 if quick else 7)
        best_other = min(v for k, v in timings.items() if "BuddyArena" not in k)
        results[name] = {"us_per_op": timings, "speedup_vs_best_other": best_other / timings["BuddyArena"],
                         "paged_speedup_vs_best_other": best_other / timings["paged BuddyArena"]}
    return results


def build_cpp() -> None:
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(BUILD), "-DLATTE_BUILD_PYTHON=OFF",
                    "-DLATTE_BUILD_BENCHMARKS=ON", "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["nice", "cmake", "--build", str(BUILD), "-j2", "--target",
                    "memory_fast_path_bench", "memory_trace_replay"], check=True, stdout=subprocess.DEVNULL)


def run_json(executable: str, *args: str) -> dict:
    out = subprocess.run([str(BUILD / "csrc" / "benchmarks" / executable), *args],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


TRACE_ROWS = (("buddy_arena", "BuddyArena"), ("buddy_arena_pow2_capacity", "BuddyArena, power-of-two capacity"),
              ("binary_buddy_no_trim", "binary buddy without tail trimming"),
              ("paged_arena", "paged BuddyArena (1 MiB pages)"),
              ("caching_allocator_model", "caching-allocator model (PyTorch-like)"))


def _slower(speedup: float) -> str:
    return f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup:.2f}x slower"


def summarize(py: dict, fast: dict, trace: dict, large: dict, cold_ns_per_mib: float) -> dict:
    """The page's view of a run: the targets, and one table per part."""
    mix = next(r for name, r in py.items() if "mix" in name)
    paged = trace["paged_arena"]
    paged_held = paged["peak_reserved"] / paged["peak_live"]
    warm = {int(size): r["paged_ns"] / r["buddy_ns"] for size, r in large.items()}
    fixed = {name: r["speedup_vs_best_other"] for name, r in py.items() if "mix" not in name}
    ns = [r["arena_ns"] for r in fast.values()]
    arena = trace["buddy_arena"]
    capacity = f"{trace['capacity'] / MiB:,.0f} MiB"
    return dict(
        summary=(f"Every ratio is measured in the same run as its baseline: contenders take turns within each "
                 f"round, best of the rounds. The trace: {trace['ops']:,} operations of a synthetic serving trace "
                 f"(peak live {trace['trace_peak_live'] / MiB:,.0f} MiB) replayed into {capacity}."),
        targets=[Target("arena ≥ 5x faster than the best of numpy, torch and malloc on a 4 KiB-64 MiB mix "
                        "(alloc + touch + free)", f"{mix['speedup_vs_best_other']:.1f}x",
                        "yes" if mix["speedup_vs_best_other"] >= 5 else "no"),
                 Target("arena no more than 1.2x slower on fixed sizes",
                        ", ".join(f"{name.replace('fixed ', '')} {_slower(v)}" for name, v in fixed.items()),
                        "yes" if all(v >= 1 / 1.2 for v in fixed.values()) else
                        ("partly" if any(v >= 1 / 1.2 for v in fixed.values()) else "no"),
                        why="a fixed cost of the Python binding per call, not the allocator (see the C++ pair)"),
                 Target("≤ 100 ns per small allocate/free pair (C++)", f"{min(ns):.0f}-{max(ns):.0f} ns",
                        "yes" if max(ns) <= 100 else "no"),
                 Target("trace replay: peak reserved / peak live ≤ 1.25",
                        f"{arena['peak_reserved'] / arena['peak_live']:.3f}",
                        "yes" if arena["peak_reserved"] / arena["peak_live"] <= 1.25 else "no"),
                 Target("trace replay: no failures while live ≤ 80 % of capacity",
                        f"{arena['failures_below_80pct']} at {capacity}, "
                        f"{trace['buddy_arena_pow2_capacity']['failures_below_80pct']} at "
                        f"{trace['pow2_capacity'] / MiB:,.0f} MiB",
                        "yes" if arena["failures_below_80pct"] == 0 else "no",
                        why="a buddy request needs a free aligned power-of-two block, which large requests find "
                            "in few places"),
                 Target("trace replay: external fragmentation flat, ≤ 10 %",
                        f"mean {arena['ext_frag_mean']:.2f}, max {arena['ext_frag_max']:.2f}",
                        "yes" if arena["ext_frag_max"] <= 0.10 else "no",
                        why="a buddy's free space is split at power-of-two boundaries (part metric, part real)"),
                 Target("paged: trace replay, no failure while live + request ≤ capacity - one page",
                        f"{paged['failures_with_a_page_to_spare']} (of {paged['failures']} failures)",
                        "yes" if paged["failures_with_a_page_to_spare"] == 0 else "no"),
                 Target("paged: pages live blocks touch at the peak / peak live ≤ 1.10", f"{paged_held:.3f}",
                        "yes" if paged_held <= 1.10 else "no"),
                 Target("paged: the 4 KiB-64 MiB mix ≥ 5x the best of numpy, torch and malloc",
                        f"{mix['paged_speedup_vs_best_other']:.1f}x",
                        "yes" if mix["paged_speedup_vs_best_other"] >= 5 else "no"),
                 Target("paged: a warm large allocate/free pair ≤ 2x the buddy's",
                        ", ".join(f"{size // MiB} MiB {ratio:.2f}x" for size, ratio in warm.items()),
                        "yes" if max(warm.values()) <= 2 else "no"),
                 Target("paged: the cold map cost, reported", f"{cold_ns_per_mib / 1e3:,.0f} µs per MiB", "yes")],
        tables=[Table("alloc + write one byte per 4 KiB page + free, from Python, µs per op:",
                      ["workload", *mix["us_per_op"], "arena against the best other"],
                      [[name, *(f"{v:.1f}" for v in r["us_per_op"].values()), _slower(r["speedup_vs_best_other"])]
                       for name, r in py.items()]),
                Table("C++ small path, ns per allocate/free pair (best of 5 x 2M pairs):", ["size", "arena", "malloc"],
                      [[f"{size} B" if size.isdigit() else size.replace("_", " "), f"{r['arena_ns']:.1f}", f"{r['malloc_ns']:.1f}" if "malloc_ns" in r else "-"]
                       for size, r in fast.items()]),
                Table("C++ large blocks, ns per warm allocate/free pair (best of 5 x 200K pairs; the paged "
                      "arena's cold map, pages faulted in as they are mapped, "
                      f"{cold_ns_per_mib / 1e3:,.0f} µs per MiB):", ["size", "buddy", "paged", "paged / buddy"],
                      [[f"{int(size) // MiB} MiB", f"{r['buddy_ns']:.1f}", f"{r['paged_ns']:.1f}",
                        f"{r['paged_ns'] / r['buddy_ns']:.2f}x"] for size, r in large.items()]),
                Table(f"Trace replay into {capacity} (a paged arena's peak reserved: the pages live blocks touch):",
                      ["allocator", "peak reserved / peak live", "external fragmentation mean / max",
                       "failures while live ≤ 80 %", "failures with a page to spare", "replay s"],
                      [[label, f"{trace[key]['peak_reserved'] / trace[key]['peak_live']:.3f}",
                        f"{trace[key]['ext_frag_mean']:.2f} / {trace[key]['ext_frag_max']:.2f}",
                        str(trace[key]["failures_below_80pct"]), str(trace[key]["failures_with_a_page_to_spare"]),
                        f"{trace[key]['seconds']:.2f}"]
                       for key, label in TRACE_ROWS]
                      + [["glibc malloc, every page touched (peak RSS / peak live)",
                          f"{trace['glibc_malloc']['peak_rss'] / trace['trace_peak_live']:.3f}", "-", "-", "-",
                          f"{trace['glibc_malloc']['seconds']:.2f}"]])])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and a 200K-op trace")
    parser.add_argument("--json", type=Path, help="also write all figures to this file")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results",
                        help="where allocator.json, the page's input, goes (default: %(default)s)")
    args = parser.parse_args(argv)
    build_cpp()  # before the quiet wait: the build loads the machine
    record = new_results("allocator", "allocator", "Allocator: the buddy arena against numpy, torch and malloc, its "
                         "C++ small path, a serving trace", command_line("benchmarks/allocator.py", argv),
                         wait_until_quiet(log=print), ROOT)

    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, torch {torch.__version__}")
    print("\n== alloc + touch every page + free (Python), us per op, best of 7 interleaved rounds ==")
    py = python_benchmarks(args.quick)
    for name, r in py.items():
        cells = "  ".join(f"{k} {v:9.1f}" for k, v in r["us_per_op"].items())
        target = ">= 5x" if "mix" in name else ">= 0.83x (never 1.2x slower)"
        print(f"{name:28s} {cells}  | arena speedup vs best other {r['speedup_vs_best_other']:.2f}x (target {target})")

    print("\n== C++ small path: ns per allocate/free pair (best of 5 x 2M) ==")
    fast = run_json("memory_fast_path_bench")
    large, cold_ns_per_mib = fast.pop("large_pairs"), fast.pop("cold_map_ns_per_mib")
    for size, r in fast.items():
        extra = f"  malloc {r['malloc_ns']:.1f}  ratio {r['arena_ns'] / r['malloc_ns']:.2f}x" if "malloc_ns" in r else ""
        print(f"  {size:>12s}: arena {r['arena_ns']:.1f} ns{extra}  (target <= 100 ns)")

    print("\n== trace replay ==")
    trace = run_json("memory_trace_replay", "200000" if args.quick else "1000000")
    print(f"  {trace['ops']} ops, trace peak live {trace['trace_peak_live'] / MiB:.0f} MiB, "
          f"capacity {trace['capacity'] / MiB:.0f} MiB (peak live at 85%), pow2 capacity {trace['pow2_capacity'] / MiB:.0f} MiB")
    for size, r in large.items():
        print(f"  large {int(size) // MiB} MiB warm pair: buddy {r['buddy_ns']:.1f} ns, paged {r['paged_ns']:.1f} ns "
              f"({r['paged_ns'] / r['buddy_ns']:.2f}x, target <= 2x)")
    print(f"  paged cold map: {cold_ns_per_mib / 1e3:,.0f} us per MiB")
    for name in ("buddy_arena", "buddy_arena_pow2_capacity", "binary_buddy_no_trim", "paged_arena",
                 "caching_allocator_model"):
        r = trace[name]
        print(f"  {name:27s} peak reserved/peak live {r['peak_reserved'] / r['peak_live']:.3f} (target <= 1.25)  "
              f"ext frag mean {r['ext_frag_mean']:.2f} max {r['ext_frag_max']:.2f} (target <= 0.10)  "
              f"failures below 80% {r['failures_below_80pct']} (target 0), with a page to spare "
              f"{r['failures_with_a_page_to_spare']}  replay {r['seconds']:.2f} s")
    glibc = trace["glibc_malloc"]
    print(f"  {'glibc_malloc':27s} peak RSS/peak live {glibc['peak_rss'] / trace['trace_peak_live']:.3f}  replay {glibc['seconds']:.2f} s")
    figures = {"python": py, "fast_path": fast, "large_pairs": large, "cold_map_ns_per_mib": cold_ns_per_mib,
               "trace": trace}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    print(f"wrote {write_summary(record, summarize(py, fast, trace, large, cold_ns_per_mib), args.results_dir, figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
