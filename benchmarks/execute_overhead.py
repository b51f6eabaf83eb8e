"""latte's own cost per `execute` call, in process: the backend's Python and native work around
a model call, with stand-in stub objects (no tritonserver), so the figure is latte's alone.

    .venv/bin/python benchmarks/execute_overhead.py [--requests 1,16] [--calls 1000] [--floor]

Serves the ONNX Identity model on FP32[64] (the model call is ~5 us) through
`LatteModel.execute` with N requests per call; prints the best of 7 runs of `--calls` calls:
µs per call and per request, and the stage counters latte publishes (read, engine, respond).

--floor also times, interleaved with latte, the least any batching backend can do per call
with the same objects: read each request's inputs, parameters and timeout, one native check
and one native pack of the batch, the same ONNX call, one Tensor and InferenceResponse per
request; and prints latte / floor (the median of the interleaved runs' ratios).
The stand-ins cost far less than the stub's pybind11 objects, so this is a floor for the
served figure, and a way to compare two versions of the backend on one machine.
"""

from __future__ import annotations

import argparse
import json
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
    args = parser.parse_args(argv)
    from latte.backend.standin_stub import InferenceRequest, StandinStub
    from latte.backend.triton_model import LatteModel

    model_dir = Path(tempfile.mkdtemp(prefix="latte-overhead-")) / "identity"
    write_identity_onnx(model_dir / "1" / "model.onnx")
    config = {"name": "identity", "backend": "latte", "max_batch_size": 32,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [64]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [64]}],
              "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
              "parameters": {"intra_op_threads": {"string_value": "1"}}}
    rng = np.random.default_rng(1)
    print(f"{'requests/call':>13} {'us/call':>8} {'us/request':>10} {'read':>6} {'engine':>7} {'respond':>8}  (us per request)"
          + ("   floor us/call  latte/floor" if args.floor else ""))
    for n in [int(x) for x in args.requests.split(",")]:
        model = LatteModel({"model_config": json.dumps(config), "model_repository": str(model_dir),
                            "model_version": "1"}, StandinStub)
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


def least_call(model, pb):
    """The least a batching backend can do for one call of the identity model: what the stub's
    API forces per request, latte's native check and pack, the model's own runtime."""
    from latte._native import inspect_arrays, pack_arrays

    rule = model.reader._rules["INPUT0"]
    run = model.runtime.run
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
