"""latte's own cost per `execute` call, in process: the backend's Python and native work around
a model call, with stand-in stub objects (no tritonserver), so the figure is latte's alone.

    .venv/bin/python benchmarks/execute_overhead.py [--requests 1,16] [--calls 1000] [--floor]
    .venv/bin/python benchmarks/execute_overhead.py --instructions [--requests 1,16]
    .venv/bin/python benchmarks/execute_overhead.py --cold [--requests 1,8]

Serves the ONNX Identity model on FP32[64] (the model call is ~5 us) through
`LatteModel.execute` with N requests per call; prints the best of 7 runs of `--calls` calls:
µs per call and per request, and the stage counters latte publishes (read, engine, respond).

--floor also times, interleaved with latte, the least any batching backend can do per call
with the same objects: read each request's inputs, parameters and timeout, one native check
and one native pack of the batch, the same ONNX call, one Tensor and InferenceResponse per
request; and prints latte / floor (the median of the interleaved runs' ratios).
The stand-ins cost far less than the stub's pybind11 objects, so this is a floor for the
served figure, and a way to compare two versions of the backend on one machine.

--cold times the model call alone, latte's call and the floor's, each warm (right after the same
call) and cold (after touching a 64 MiB buffer, many times a core's own caches, as the server
and perf_analyzer do between a served stub's calls): what a served call costs that a warm timing
does not show, and what a batching backend pays per call that a model.py echoing its input
does not.

--instructions counts, under valgrind's callgrind, the instructions one call of latte and of
the floor executes on the calling thread (each load run twice, with 100 and 2,100 calls, and
differenced): a figure that, unlike a timing, does not move with the machine's load (~1 minute
per contender and size);
its figures replace benchmarks/results/execute-overhead.json, from which docs/benchmarks.md is
rendered (`.venv/bin/python -m latte.bench.page`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from latte.generator.calibrate import write_identity_onnx


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", default="1,16", help="requests per execute call, comma-separated (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=1000, help="calls per timed run (default: %(default)s)")
    parser.add_argument("--floor", action="store_true", help="also time the least a batching backend can do per call")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per call under valgrind (latte and the floor) instead of timing")
    parser.add_argument("--cold", action="store_true",
                        help="time the model call alone, latte's call and the floor's, warm and after touching 64 MiB")
    parser.add_argument("--run-calls", nargs=3, metavar=("CONTENDER", "REQUESTS", "CALLS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_calls:
        contender, n, calls = args.run_calls
        run_calls(contender, int(n), int(calls))
        return 0
    if args.instructions:
        return count_instructions([int(x) for x in args.requests.split(",")], argv)
    if args.cold:
        return time_cold_calls([int(x) for x in args.requests.split(",")])
    from latte.backend.standin_stub import InferenceRequest, StandinStub

    rng = np.random.default_rng(1)
    print(f"{'requests/call':>13} {'us/call':>8} {'us/request':>10} {'read':>6} {'engine':>7} {'respond':>8}  (us per request)"
          + ("   floor us/call  latte/floor" if args.floor else ""))
    for n in [int(x) for x in args.requests.split(",")]:
        model = identity_model()
        requests = [InferenceRequest({"INPUT0": rng.random((1, 64), dtype=np.float32)}) for _ in range(n)]
        floor = least_call(model, StandinStub)
        contenders = [model.execute] + ([floor] if args.floor else [])
        for call in contenders:
            for _ in range(200):
                call(requests)
        runs = {call: [] for call in contenders}
        for _ in range(7):
            for call in contenders:  # interleaved, so a noisy moment hits both
                started = time.perf_counter()
                for _ in range(args.calls):
                    call(requests)
                runs[call].append((time.perf_counter() - started) / args.calls)
        counters, _ = model.metrics.aggregate.snapshot()
        answered = counters.get(("latte_execute_requests_total", ()), 1.0)
        stages = [counters.get(("latte_execute_us_total", (("stage", s),)), 0.0) / answered
                  for s in ("read", "engine", "respond")]
        best = min(runs[model.execute]) * 1e6
        line = f"{n:>13} {best:>8.1f} {best / n:>10.2f} {stages[0]:>6.2f} {stages[1]:>7.2f} {stages[2]:>8.2f}"
        if args.floor:
            ratios = sorted(a / b for a, b in zip(runs[model.execute], runs[floor]))
            line += f"   {min(runs[floor]) * 1e6:>14.1f}  {ratios[len(ratios) // 2]:>11.2f}x"
        print(line)
        model.finalize()
    return 0


def identity_model():
    """The ONNX Identity model on FP32[64], loaded by LatteModel with stand-in stub objects."""
    from latte.backend.standin_stub import StandinStub
    from latte.backend.triton_model import LatteModel

    model_dir = Path(tempfile.mkdtemp(prefix="latte-overhead-")) / "identity"
    write_identity_onnx(model_dir / "1" / "model.onnx")
    config = {"name": "identity", "backend": "latte", "max_batch_size": 32,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [64]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [64]}],
              "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
              "parameters": {"intra_op_threads": {"string_value": "1"}}}
    return LatteModel({"model_config": json.dumps(config), "model_repository": str(model_dir),
                       "model_version": "1"}, StandinStub)


# Instruction counts do not move with the machine's load the way timings do (±20 % here): a
# run of FEW calls and one of FEW + COUNTED calls, both under callgrind, differ by the
# counted calls' instructions alone.
_FEW, _COUNTED = 100, 2000


def run_calls(contender: str, n: int, calls: int) -> None:
    """What --instructions counts: load, warm up, then `calls` calls of one contender."""
    from latte.backend.standin_stub import InferenceRequest, StandinStub

    model = identity_model()
    model.publisher.close()  # a thread that wakes by the clock would count more the slower the run
    requests = [InferenceRequest({"INPUT0": np.ones((1, 64), np.float32)}) for _ in range(n)]
    call = model.execute if contender == "latte" else least_call(model, StandinStub)
    for _ in range(50 + calls):
        call(requests)
    model.finalize()


def count_instructions(sizes, argv=None) -> int:
    if shutil.which("valgrind") is None:
        print("--instructions needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    # Idle math-library threads spin by the clock as well; one thread each keeps the count
    # a property of the code.
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}

    def collected(contender: str, n: int, calls: int) -> int:
        """The instructions of the thread that makes the calls. A library's worker threads
        (onnxruntime's) spin by the clock after each call: counted, they moved the figure by
        ~10 % with other work on the machine, so they are left out."""
        with tempfile.TemporaryDirectory(prefix="latte-callgrind-") as where:
            subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes",
                            f"--callgrind-out-file={where}/counts", sys.executable, __file__, "--run-calls",
                            contender, str(n), str(calls)], env=env, capture_output=True, text=True, check=True)
            main_thread = Path(where) / "counts-01"
            match = re.search(r"^(?:summary|totals):\s*(\d+)", main_thread.read_text() if main_thread.exists() else "",
                              re.MULTILINE)
        if match is None:
            raise RuntimeError(f"callgrind wrote no count for the calling thread ({main_thread.name})")
        return int(match.group(1))

    from latte.bench.results import Table, command_line, new_results, write_summary

    record = new_results("execute-overhead", "serving", "latte's own cost per execute call, in instructions",
                         command_line("benchmarks/execute_overhead.py", argv), os.getloadavg()[0],
                         Path(__file__).resolve().parent)
    print(f"{'requests/call':>13} {'latte instr/call':>17} {'floor instr/call':>17} {'latte/floor':>12}")
    rows = []
    for n in sizes:
        per_call = {}
        for contender in ("latte", "floor"):
            per_call[contender] = (collected(contender, n, _FEW + _COUNTED) - collected(contender, n, _FEW)) / _COUNTED
        print(f"{n:>13} {per_call['latte']:>17,.0f} {per_call['floor']:>17,.0f} "
              f"{per_call['latte'] / per_call['floor']:>11.2f}x", flush=True)
        rows.append([str(n), f"{per_call['latte']:,.0f}", f"{per_call['floor']:,.0f}",
                     f"{per_call['latte'] - per_call['floor']:,.0f}", f"{per_call['latte'] / per_call['floor']:.2f}x"])
    summary = ("Instructions one `execute` call of the ONNX Identity model executes, in process with stand-in "
               "stub objects, counted under valgrind's callgrind (two loads differenced): latte against the "
               "least any batching backend can do with the same objects (the floor). The calling thread's "
               "instructions alone (onnxruntime's worker threads spin by the clock): a count the machine's "
               "load does not move.")
    tables = [Table("", ["requests a call", "latte", "floor", "latte's own", "latte / floor"], rows)]
    written = write_summary(record, dict(summary=summary, tables=tables), Path(__file__).resolve().parent / "results")
    print(f"wrote {written}")
    return 0


# Many times a core's own caches (L2: 2 MiB per core on the 2-core box), which is what a
# served stub loses to tritonserver and perf_analyzer between two calls; not necessarily
# the whole of a large shared L3.
_EVICT_BYTES = 64 << 20


def time_cold_calls(sizes) -> int:
    """Median µs, warm and after touching 64 MiB (a core's own caches evicted, dirty lines left
    to write back), of the identity model's runtime call alone, of latte's `execute` and of the
    least a batching backend can do (least_call), N requests of one row each."""
    from latte.backend.standin_stub import InferenceRequest, StandinStub

    model = identity_model()
    model.publisher.close()
    run = model.graph.steps[0].runtime.run
    floor = least_call(model, StandinStub)
    evict = np.zeros(_EVICT_BYTES, np.uint8)
    print(f"{'requests/call':>13} {'':>8} {'warm us':>8} {'cold us':>8} {'cold/warm':>10}")
    for n in sizes:
        requests = [InferenceRequest({"INPUT0": np.ones((1, 64), np.float32)}) for _ in range(n)]
        feed = {"INPUT0": np.ones((n, 64), np.float32)}
        calls = {"model": lambda: run(feed), "latte": lambda: model.execute(requests), "floor": lambda: floor(requests)}
        timings = {(name, cold): [] for name in calls for cold in (False, True)}
        for call in calls.values():
            for _ in range(50):
                call()
        for _ in range(300):
            for name, call in calls.items():
                for cold in (False, True):  # interleaved, so a noisy moment hits every contender
                    if cold:
                        evict += 1  # every cache line read and written
                    else:
                        call()  # the same call just before: its code and data in the caches
                    started = time.perf_counter_ns()
                    call()
                    timings[name, cold].append(time.perf_counter_ns() - started)
        for name in calls:
            warm, cold = (sorted(timings[name, c])[len(timings[name, c]) // 2] / 1e3 for c in (False, True))
            print(f"{n:>13} {name:>8} {warm:>8.1f} {cold:>8.1f} {cold / warm:>9.1f}x", flush=True)
    model.finalize()
    return 0


def least_call(model, pb):
    """The least a batching backend can do for one call of the identity model: what the stub's
    API forces per request, latte's native check and pack, the model's own runtime."""
    from latte._native import inspect_arrays, pack_arrays

    rule = model.reader._rules["INPUT0"]
    run = model.graph.steps[0].runtime.run
    Tensor, InferenceResponse = pb.Tensor, pb.InferenceResponse
    pad = bytes(4)

    def call(requests):
        arrays = []
        for request in requests:
            for tensor in request.inputs():
                tensor.name()
                arrays.append(tensor.as_numpy())
            request.parameters()
            request.timeout()
        rows, _, _ = inspect_arrays(rule, arrays)
        if len(arrays) == 1:
            batch = arrays[0]
        else:
            batch = np.empty((sum(rows), 64), np.float32)
            pack_arrays(arrays, batch, pad)
        out = run({"INPUT0": batch})["OUTPUT0"]
        return [InferenceResponse(output_tensors=[Tensor("OUTPUT0", row)]) for row in out[:, None]]

    return call


if __name__ == "__main__":
    sys.exit(main())
