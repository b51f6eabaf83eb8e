"""Batcher stall: Triton 2.51's dynamic batcher leaving one instance idle ~500 ms.

    .venv/bin/python benchmarks/batcher_stall.py                       # 90 s to reproduce, 10 s on the rendered config
    .venv/bin/python benchmarks/batcher_stall.py --reproduce-within-s 300 --flood-s 60

Behind priority levels or a queue policy the batcher stalls one instance ~500 ms (docs/backend.md,
Priorities); the configs latte renders have two instances, which makes the stall rare: a missed
wake-up then needs both instances to finish at once. This measures Triton, not latte, and the
stall's rate follows the machine's load, so it is a benchmark rather than a test (`latte
validate`'s warning on such configs is checked by tests/unit/test_generator_validate.py).

Both models are the stock Python backend echoing its input, so only the batching settings
differ: a hand-written `priority_levels: 2` with one instance, and the dynamic_batching and
instance_group that `latte generate` derives for a two-priority spec with `priority_queue:
triton`. A closed-loop flood of --clients gRPC clients runs against each: against the
hand-written config until the first request takes 400 ms or more (at most
--reproduce-within-s), against the rendered one for --flood-s. A 1 ms model comes nowhere near
400 ms under this flood (P99 ~50 ms on the 2-core box), so a request that slow is the stall.
Prints both floods' figures and writes them to OUT/batcher-stall.json; exits 1 unless the
hand-written config stalled and the rendered one stalled at most one request in 2,000.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

from latte.bench.results import machine_description
from latte.generator.derive import derive
from latte.generator.model_folder import render_model_config
from latte.generator.profile_data import Point, Profile
from latte.generator.validate import batcher_stall, parse_config
from latte.triton import TritonServer

STALL_S = 0.4
# One instance stalled 78 of 4,613 requests (1.7 %) in a measured 8 s flood; two instances
# 1 of 24,804 (0.004 %) on a loaded box. A rendered config may stall at most this often:
RENDERED_STALL_RATE = 1 / 2000

ECHO_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
                for r in requests]
'''
HAND_WRITTEN = "hand_written_priorities"
RENDERED = "rendered_priorities"


def rendered_config() -> str:
    """What `latte generate` renders for a two-priority model with a 50 ms SLO on 2 cores, with
    the priorities in Triton's queue (`priority_queue: triton`; latte's queue is the default)."""
    points = [Point(b, None, 1.0, 1.0, 1.0, 1000 * b) for b in (1, 2, 4, 8)]
    tensors = {"inputs": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
               "outputs": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]}
    profile = Profile("echo.onnx", "onnx", "cpu", 1, tensors["inputs"], tensors["outputs"], points)
    d = derive(profile, slo_ms=50, cores=2, priority_levels=2, priority_queue="triton")
    return render_model_config({"name": RENDERED, "backend": "python", "max_batch_size": d.max_batch_size, **tensors,
                                "dynamic_batching": d.dynamic_batching, "instance_groups": d.instance_groups(),
                                "parameters": {}})


HAND_WRITTEN_CONFIG = f"""name: "{HAND_WRITTEN}"
backend: "python"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ priority_levels: 2 default_priority_level: 2 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def write_repository(repo: Path) -> None:
    for name, config in ((HAND_WRITTEN, HAND_WRITTEN_CONFIG), (RENDERED, rendered_config())):
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "1" / "model.py").write_text(ECHO_MODEL)
        (repo / name / "config.pbtxt").write_text(config)


def flood(url: str, model: str, clients: int, seconds: float, stop_on_stall: bool) -> np.ndarray:
    """Latencies (s) of `clients` closed-loop gRPC clients sending one row at a time, for
    `seconds` or, with stop_on_stall, until one request takes STALL_S or more."""
    import tritonclient.grpc as grpcclient

    latencies, lock, stop = [], threading.Lock(), threading.Event()
    deadline = time.monotonic() + seconds

    def client() -> None:
        channel = grpcclient.InferenceServerClient(url)
        row = grpcclient.InferInput("x", [1, 4], "FP32")
        row.set_data_from_numpy(np.ones((1, 4), np.float32))
        mine = []
        while not stop.is_set() and time.monotonic() < deadline:
            start = time.monotonic()
            channel.infer(model, [row])
            mine.append(time.monotonic() - start)
            if stop_on_stall and mine[-1] >= STALL_S:
                stop.set()
        channel.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return np.array(latencies)


def figures(latencies: np.ndarray, seconds: float) -> dict:
    stalled = latencies[latencies >= STALL_S]
    return {"requests": int(len(latencies)), "seconds": round(seconds, 1), "stalled": int(len(stalled)),
            "stalled_ms": np.round(np.sort(stalled) * 1000).tolist(),
            "p50_ms": round(float(np.percentile(latencies, 50)) * 1000, 2) if len(latencies) else None,
            "p99_ms": round(float(np.percentile(latencies, 99)) * 1000, 2) if len(latencies) else None,
            "max_ms": round(float(latencies.max()) * 1000, 1) if len(latencies) else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="closed-loop clients per flood (default: %(default)s)")
    parser.add_argument("--reproduce-within-s", type=float, default=90.0,
                        help="the longest flood of the hand-written config, stopped at its first stall "
                             "(default: %(default)s)")
    parser.add_argument("--flood-s", type=float, default=10.0,
                        help="the flood of the rendered config (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path(".latte/batcher-stall"))
    args = parser.parse_args(argv)
    if args.clients < 1 or args.reproduce_within_s <= 0 or args.flood_s <= 0:
        parser.error("--clients must be >= 1 and the floods' durations > 0 s")

    # The configs as `latte validate` sees them: the hand-written one warned about, the rendered one not.
    warning = batcher_stall(parse_config(HAND_WRITTEN_CONFIG))
    print(f"latte validate on {HAND_WRITTEN}: {warning or 'no warning'}")
    print(f"latte validate on {RENDERED}: {batcher_stall(parse_config(rendered_config())) or 'no warning'}")

    repo = args.out / "repository"
    write_repository(repo)
    result = {"machine": machine_description(), "clients": args.clients, "stall_ms": STALL_S * 1000}
    with TritonServer(repo, log_path=args.out / "tritonserver.log") as server:
        print(f"flooding {HAND_WRITTEN} (one instance) until its first stall, at most {args.reproduce_within_s:g} s",
              flush=True)
        started = time.monotonic()
        latencies = flood(server.grpc_url, HAND_WRITTEN, args.clients, args.reproduce_within_s, stop_on_stall=True)
        result[HAND_WRITTEN] = figures(latencies, time.monotonic() - started)
        print(f"flooding {RENDERED} (as `latte generate` renders it) for {args.flood_s:g} s", flush=True)
        started = time.monotonic()
        latencies = flood(server.grpc_url, RENDERED, args.clients, args.flood_s, stop_on_stall=False)
        result[RENDERED] = figures(latencies, time.monotonic() - started)

    hand, rendered = result[HAND_WRITTEN], result[RENDERED]
    # The batcher's slot wait times out after 500 ms: stalled requests end just past it (or
    # past twice that, when it misses the wake-up again).
    result["reproduced"] = hand["stalled"] > 0 and min(hand["stalled_ms"]) > 450
    result["rendered_rare"] = rendered["requests"] > 0 and rendered["stalled"] <= rendered["requests"] * RENDERED_STALL_RATE
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "batcher-stall.json"
    path.write_text(json.dumps(result, indent=1) + "\n")

    print(f"\n{args.clients} closed-loop clients on {result['machine']}")
    for name, what in ((HAND_WRITTEN, "one instance, hand-written"), (RENDERED, "rendered")):
        f = result[name]
        print(f"  {name} ({what}): {f['stalled']} of {f['requests']} requests took {STALL_S * 1000:.0f} ms or more "
              f"in {f['seconds']:g} s (P50 {f['p50_ms']} ms, P99 {f['p99_ms']} ms, max {f['max_ms']} ms)"
              + (f"; stalled (ms): {f['stalled_ms'][:10]}" if f["stalled"] else ""))
    print(f"stall reproduced on the hand-written config: {result['reproduced']}")
    print(f"rendered config stalls at most 1 request in {1 / RENDERED_STALL_RATE:,.0f}: {result['rendered_rare']}")
    print(f"details: {path}")
    return 0 if result["reproduced"] and result["rendered_rare"] else 1


if __name__ == "__main__":
    sys.exit(main())
