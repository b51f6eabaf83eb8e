"""One request at a time, in process: where a latte call's time goes against the stock loop's,
on the instance's device, with no server around either.

    .venv/bin/python benchmarks/one_call.py [--models sequence,ranker] [--device cuda] [--calls 300] [--rounds 5]
        [--profile] [--json FILE] [--results-dir DIR]

Each contender answers the same requests (the serving benchmark's lengths), one per call,
cycling through 256 of them; contenders are interleaved, `--rounds` times, and the median µs
per call of each is printed with its ratio to the stock loop's:

  stock            the stock Python model's own code: torch.from_numpy(x).to(device), the module
                   as loaded, .cpu().numpy() (src/latte/examples/stock_python_model.py)
  stock_frozen     the same over the module torch.jit.freeze makes (latte's default)
  runtime          latte's TorchRuntime.run (frozen), on the thread that loaded it
  runtime_unfrozen the same with freeze false
  execute          LatteModel.execute over stand-in stub objects, as the served copy's config
                   sets it up (KIND_GPU on a CUDA device)
  execute_unfrozen the same with parameter freeze false

The steps between two contenders say which part of latte's path a difference at concurrency 1
comes from: the module (frozen or not), the runtime's wrappers, or the backend around them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CONTENDERS = ("stock", "stock_frozen", "runtime", "runtime_unfrozen", "execute", "execute_unfrozen")


def latte_model(model_dir: Path, device: str, freeze: bool):
    """LatteModel over the stand-in stub, from the served copy's config.pbtxt."""
    from google.protobuf.json_format import MessageToDict

    from latte.backend.standin_stub import StandinStub
    from latte.backend.triton_model import LatteModel
    from latte.generator.validate import parse_config_file

    config = MessageToDict(parse_config_file(model_dir / "config.pbtxt"), preserving_proto_field_name=True)
    config.setdefault("parameters", {})["freeze"] = {"string_value": str(freeze).lower()}
    args = {"model_config": json.dumps(config), "model_repository": str(model_dir), "model_version": "1"}
    if device.startswith("cuda"):
        args.update(model_instance_kind="GPU", model_instance_device_id="0")
    return LatteModel(args, StandinStub)


def contenders_for(model: str, device: str, work: Path):
    """name -> (call taking one request's array, what to close after)."""
    import torch

    from latte.backend.runtimes.torch_runtime import TorchRuntime
    from latte.backend.standin_stub import InferenceRequest
    from latte.examples import CATALOG
    from serving import SETTINGS, add_contenders, model_file, torch_runner

    example = CATALOG[model]
    setting = SETTINGS[model]
    source = model_file(example, work, "torchscript")
    kind = "KIND_GPU" if device.startswith("cuda") else "KIND_CPU"
    names = add_contenders(work / "repo", example, source, setting, kind=kind)
    model_dir = work / "repo" / names["latte"]
    input_name, output_name = example.inputs[0].name, example.outputs[0].name
    torch.set_num_threads(1)
    loaded = torch.jit.load(str(source), map_location=device).eval()
    frozen = torch.jit.freeze(torch.jit.load(str(source), map_location=device).eval(), optimize_numerics=False)
    calls = {"stock": (torch_runner(loaded, device), None), "stock_frozen": (torch_runner(frozen, device), None)}
    for name, freeze in (("runtime", True), ("runtime_unfrozen", False)):
        runtime = TorchRuntime("torchscript", source, [input_name], [output_name], 1, 1, device, freeze=freeze)
        calls[name] = ((lambda r: lambda x: r.run({input_name: x})[output_name])(runtime), runtime.close)
    for name, freeze in (("execute", True), ("execute_unfrozen", False)):
        served = latte_model(model_dir, device, freeze)

        def call(x, served=served):
            response = served.execute([InferenceRequest({input_name: x})])[0]
            if response.has_error():
                raise RuntimeError(response.error().message())
            return response.output_tensors()[0].as_numpy()
        calls[name] = (call, served.finalize)
    return calls, example, setting


def requests(example, setting, count: int = 256):
    from serving import samples_for

    name = example.inputs[0].name
    return [s[name][None] for s in samples_for(example, setting, count)]


def measure(model: str, device: str, calls_per_round: int, rounds: int, work: Path, profile: bool = False) -> dict:
    calls, example, setting = contenders_for(model, device, work)
    xs = requests(example, setting)
    reference = [calls["stock"][0](x) for x in xs[:16]]
    for name, (call, _) in calls.items():  # warm, and the same answers
        for _ in range(3):
            for x in xs:
                call(x)
        worst = max(float(np.abs(call(x) - want).max()) for x, want in zip(xs[:16], reference))
        if worst > 1e-3:
            raise SystemExit(f"one_call: {model} {name} differs from the stock loop by {worst:g}")
    timings = {name: [] for name in calls}
    for round_ in range(rounds):
        order = list(calls) if round_ % 2 == 0 else list(reversed(list(calls)))
        for name in order:
            call = calls[name][0]
            started = time.perf_counter()
            for i in range(calls_per_round):
                call(xs[i % len(xs)])
            timings[name].append((time.perf_counter() - started) / calls_per_round * 1e6)
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for i in range(calls_per_round):
            calls["execute"][0](xs[i % len(xs)])
        profiler.disable()
        print(f"{model}: execute under cProfile, {calls_per_round} calls, by own time")
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    for _, close in calls.values():
        if close is not None:
            close()
    medians = {name: statistics.median(runs) for name, runs in timings.items()}
    return {"model": model, "device": device, "rounds": rounds, "calls_per_round": calls_per_round,
            "us_per_call": medians, "runs": timings,
            "ratio_to_stock": {name: medians[name] / medians["stock"] for name in medians}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="sequence,ranker")
    parser.add_argument("--device", default="cuda", help="cuda or cpu (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=300, help="calls of each contender per round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--results-dir", type=Path, help="write the results file (one-call-DEVICE.json) here")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of latte's execute")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            print("one_call: no CUDA device", file=sys.stderr)
            return 2
    found = []
    load = os.getloadavg()[0]
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix=f"latte-one-call-{model}-") as work:
            figures = measure(model, args.device, args.calls, args.rounds, Path(work), args.profile)
        found.append(figures)
        print(f"{model} on {args.device}, load {os.getloadavg()[0]:.2f}: median µs per call of {args.rounds} rounds")
        for name in CONTENDERS:
            runs = " ".join(f"{t:.0f}" for t in figures["runs"][name])
            print(f"  {name:<17} {figures['us_per_call'][name]:>8.1f}  {figures['ratio_to_stock'][name]:>5.2f}x  ({runs})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(found, indent=1) + "\n")
    if args.results_dir:
        from latte.bench.results import command_line, new_results

        record = new_results(f"one-call-{'gpu' if args.device.startswith('cuda') else 'cpu'}",
                             "gpu" if args.device.startswith("cuda") else "serving",
                             "One request at a time, in process: latte's runtime and execute against the stock loop",
                             os.environ.get("LATTE_RESULTS_COMMAND") or command_line("benchmarks/one_call.py", argv),
                             load, HERE)
        print(f"wrote {write_record(record, found, args.results_dir)}")
    return 0


def write_record(record, found, directory: Path) -> Path:
    """The results file of `found` (measure's figures of each model) on `record`'s machine."""
    from latte.bench.results import Table, write_summary

    rows = []
    for figures in found:
        times, ratio = figures["us_per_call"], figures["ratio_to_stock"]
        rows.append([figures["model"]] + [f"{times[name]:.0f} ({ratio[name]:.2f}x)" for name in CONTENDERS])
    rounds = found[0]["rounds"]
    ratios = {f["model"]: f["ratio_to_stock"] for f in found}
    summary = ("One request a call, in process with no server, the serving benchmark's lengths on the "
               f"instance's device: µs per call (medians of {rounds} interleaved rounds) and the ratio to the "
               "stock Python model's own code. "
               + "; ".join(f"`{model}`: the stock code over the frozen module {r['stock_frozen']:.2f}x, latte's "
                           f"runtime {r['runtime']:.2f}x, its execute {r['execute']:.2f}x"
                           for model, r in ratios.items()) + ".")
    tables = [Table("µs per call (ratio to stock):", ["model", *CONTENDERS], rows)]
    return write_summary(record, dict(summary=summary, tables=tables), directory, figures={"models": found})


if __name__ == "__main__":
    sys.exit(main())
