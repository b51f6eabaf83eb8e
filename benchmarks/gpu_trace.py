"""The device allocations of gpu_allocator.py's loop, recorded on a GPU and replayed here into a
host arena paged as the device one is, so that a page policy can be tried without a GPU.

    python3 benchmarks/gpu_trace.py record --models sequence,encoder --steps 6000 --out build/gpu/traces
        on the GPU machine: runs each model's loop (the same shapes, seed and steps as
        gpu_allocator.py) under PyTorch's caching allocator with its memory history on, and
        writes OUT/<model>.npz: every tensor allocation and free, in order, with its size.
    .venv/bin/python benchmarks/gpu_trace.py replay benchmarks/traces/encoder.npz --page-mib 2
        here: replays a trace into latte's paged host arena (pages of the device's 2 MiB
        granularity) and the device's idle share, and prints peak live, peak held and held /
        live, and the map calls; --idle-share 0 keeps every idle page, as the host does.

benchmarks/traces/ holds the two models' traces as recorded on an H200 (torch 2.11, 6,000 steps).

The trace holds the caching allocator's block sizes (requests rounded up to 512 bytes), which is
within 512 bytes of what the arena's plug-in is asked for.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from latte.memory import DEVICE_IDLE_SHARE  # a CUDA device's pages' own; the host's keep every idle page

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
ALLOC, FREE = 0, 1


def record(model_name: str, steps: int, seed: int, out: Path) -> dict:
    import numpy as np
    import torch

    sys.path.insert(0, str(HERE))
    import gpu_allocator

    torch.cuda.init()
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                             max_entries=4_000_000)
    model, vocab = gpu_allocator.build_model(model_name)
    model = model.cuda()
    with torch.inference_mode():
        for shape in gpu_allocator.shapes(steps, seed):
            gpu_allocator.run_step(torch, model, shape, vocab)
    torch.cuda.synchronize()
    events = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    kinds, ids, sizes = [], [], []
    live: dict[int, int] = {}
    next_id = 0
    for event in events:
        action = event["action"]
        if action == "alloc":
            live[event["addr"]] = next_id
            kinds.append(ALLOC), ids.append(next_id), sizes.append(event["size"])
            next_id += 1
        elif action == "free_completed" and event["addr"] in live:
            kinds.append(FREE), ids.append(live.pop(event["addr"])), sizes.append(event["size"])
    path = out / f"{model_name}.npz"
    np.savez_compressed(path, kind=np.array(kinds, np.int8), id=np.array(ids, np.int32),
                        size=np.array(sizes, np.int64))
    return {"model": model_name, "events": len(kinds), "allocations": next_id, "file": str(path),
            "bytes": path.stat().st_size}


def replay(path: Path, page_mib: int, capacity_mib: int, min_block: int, idle_share: int = DEVICE_IDLE_SHARE) -> dict:
    import numpy as np

    from latte.memory import BuddyArena

    trace = np.load(path)
    kinds, ids, sizes = trace["kind"], trace["id"], trace["size"]
    arena = BuddyArena(capacity_mib * MIB, min_block=min_block, prefault=False, paged=True,
                       page_bytes=page_mib * MIB, idle_share=idle_share)
    blocks: dict[int, object] = {}  # an array over each live block; dropping it frees the block
    live = peak_live = 0
    failures = 0
    started = time.perf_counter()
    for kind, ident, size in zip(kinds.tolist(), ids.tolist(), sizes.tolist()):
        if kind == ALLOC:
            try:
                blocks[ident] = arena.empty(size, np.uint8)
            except MemoryError:
                failures += 1
                continue
            live += size
            peak_live = max(peak_live, live)
        elif blocks.pop(ident, None) is not None:
            live -= size
    seconds = time.perf_counter() - started
    stats = arena.stats()
    peak_held = stats["physical_held"]  # held pages only grow: nothing here gives memory back (release_cached)
    arena.check_invariants()
    return {"trace": path.name, "events": len(kinds), "page_mib": page_mib, "peak_live_mib": peak_live / MIB,
            "peak_held_mib": peak_held / MIB, "held_over_live": peak_held / peak_live if peak_live else None,
            "map_calls": stats["map_calls"], "unmap_calls": stats["unmap_calls"], "failures": failures,
            "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    recording = commands.add_parser("record", help="on a GPU: record the loops' allocations")
    recording.add_argument("--models", default="sequence,encoder")
    recording.add_argument("--steps", type=int, default=6000)
    recording.add_argument("--seed", type=int, default=20261125)
    recording.add_argument("--out", type=Path, default=Path("build/gpu/traces"))
    replaying = commands.add_parser("replay", help="here: replay a trace into a paged host arena")
    replaying.add_argument("traces", type=Path, nargs="+")
    replaying.add_argument("--page-mib", type=int, default=2, help="the device's page granularity")
    replaying.add_argument("--capacity-mib", type=int, default=16 << 10)
    replaying.add_argument("--min-block", type=int, default=256)
    replaying.add_argument("--idle-share", type=int, default=DEVICE_IDLE_SHARE,
                           help="idle pages kept beyond those in use, as a divisor (0: all, as on the host)")
    args = parser.parse_args()
    if args.command == "record":
        args.out.mkdir(parents=True, exist_ok=True)
        for name in args.models.split(","):
            print(json.dumps(record(name, args.steps, args.seed, args.out)), flush=True)
    else:
        for path in args.traces:
            print(json.dumps(replay(path, args.page_mib, args.capacity_mib, args.min_block, args.idle_share)),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
