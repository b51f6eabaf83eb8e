"""Allocator benchmarks for latte.memory.BuddyArena; every ratio is measured in this run.

    .venv/bin/python benchmarks/allocator.py [--quick]

1. alloc + touch every page + free from Python, on a serving-like lognormal mix of sizes
   (4 KiB..64 MiB) and on fixed sizes: BuddyArena vs numpy.empty, torch.empty, malloc (ctypes).
2. C++ small-path microbenchmark: ns per allocate/free pair (vs malloc/free).
3. C++ trace replay of a variable-length serving trace (>= 1M operations): BuddyArena vs a
   model of PyTorch's CUDA caching allocator vs glibc malloc's RSS.
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
    contenders = {
        "BuddyArena": lambda s: run_arena(arena, s),
        "numpy.empty": run_numpy,
        "torch.empty": run_torch,
        "malloc (ctypes)": run_malloc,
    }
    results = {}
    for name, sizes in workloads.items():
        timings = best_us_per_op(contenders, sizes, rounds=3 if quick else 7)
        best_other = min(v for k, v in timings.items() if k != "BuddyArena")
        results[name] = {"us_per_op": timings, "speedup_vs_best_other": best_other / timings["BuddyArena"]}
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and a 200K-op trace")
    parser.add_argument("--json", type=Path, help="also write all figures to this file")
    args = parser.parse_args()

    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, torch {torch.__version__}")
    print("\n== alloc + touch every page + free (Python), us per op, best of 7 interleaved rounds ==")
    py = python_benchmarks(args.quick)
    for name, r in py.items():
        cells = "  ".join(f"{k} {v:9.1f}" for k, v in r["us_per_op"].items())
        target = ">= 5x" if "mix" in name else ">= 0.83x (never 1.2x slower)"
        print(f"{name:28s} {cells}  | arena speedup vs best other {r['speedup_vs_best_other']:.2f}x (target {target})")

    build_cpp()
    print("\n== C++ small path: ns per allocate/free pair (best of 5 x 2M) ==")
    fast = run_json("memory_fast_path_bench")
    for size, r in fast.items():
        extra = f"  malloc {r['malloc_ns']:.1f}  ratio {r['arena_ns'] / r['malloc_ns']:.2f}x" if "malloc_ns" in r else ""
        print(f"  {size:>12s}: arena {r['arena_ns']:.1f} ns{extra}  (target <= 100 ns)")

    print("\n== trace replay ==")
    trace = run_json("memory_trace_replay", "200000" if args.quick else "1000000")
    print(f"  {trace['ops']} ops, trace peak live {trace['trace_peak_live'] / MiB:.0f} MiB, "
          f"capacity {trace['capacity'] / MiB:.0f} MiB (peak live at 85%), pow2 capacity {trace['pow2_capacity'] / MiB:.0f} MiB")
    for name in ("buddy_arena", "buddy_arena_pow2_capacity", "binary_buddy_no_trim", "caching_allocator_model"):
        r = trace[name]
        print(f"  {name:27s} peak reserved/peak live {r['peak_reserved'] / r['peak_live']:.3f} (target <= 1.25)  "
              f"ext frag mean {r['ext_frag_mean']:.2f} max {r['ext_frag_max']:.2f} (target <= 0.10)  "
              f"failures below 80% {r['failures_below_80pct']} (target 0)  replay {r['seconds']:.2f} s")
    glibc = trace["glibc_malloc"]
    print(f"  {'glibc_malloc':27s} peak RSS/peak live {glibc['peak_rss'] / trace['trace_peak_live']:.3f}  replay {glibc['seconds']:.2f} s")
    if args.json:
        args.json.write_text(json.dumps({"python": py, "fast_path": fast, "trace": trace}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
