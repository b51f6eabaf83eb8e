"""`latte profile`, `latte generate`, `latte validate`, `latte verify`, `latte tune`: the config generator."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_RAW = argparse.RawDescriptionHelpFormatter


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", formatter_class=_RAW,
        help="measure latency (P50/P99) and memory per batch size and shape bucket",
        description="""\
Measure MODEL_FILE in this process with the runtime code the latte backend serves it with,
at an explicit thread budget. For each shape bucket the batch size doubles from 1 until
throughput stops improving, memory runs short or one call passes --max-latency-ms (or
would: the last doubling's growth, carried on, passes it). With --slo-ms that ceiling is
at most half the SLO, the slowest batch that can fit it, and the longest length is swept
up to it even where its throughput has flattened; `latte generate` profiles the same way.

Then, unless --no-calibrate, takes this machine's serving cost (per batch, per request,
client round trip), measured on a short-lived tritonserver with an identity model (about
15 s) once per machine and kept a week in ~/.cache/latte (--recalibrate measures again);
the derivation adds it to the in-process latencies.

Writes OUT/profile.json (input to `latte generate` and the derivation, calibration included)
and OUT/profile.png (latency and throughput against batch size).

Input shapes come from, in order: --input flags, a config.pbtxt next to the file (or one
folder up, as in a model repository), or the ONNX graph. A -1 dimension is variable: it is
measured at several lengths (--lengths) so that latte's bucket edges can be derived.

A streaming model's stream.json (docs/streaming.md) is profiled against the number of live
streams instead (--streams): at each level the streams join in one iteration, then step
together for --max-tokens outputs; the start and step times per iteration go to
OUT/profile.json, with this machine's cost of a streamed response (an echo model on
tritonserver, kept a week). With --ttft-ms and --inter-token-ms it also prints the
max_streams and joins_per_iteration that keep both SLOs.""",
        epilog="""\
examples:
  latte profile model.onnx
  latte profile model.pt --input image:FP32:3,32,32 --intra-op-threads 2 -o prof/
  latte profile encoder.onnx --lengths 16,64,128 --slo-ms 20   # also prints derived settings
  latte profile textgen/1/stream.json --max-tokens 32 --ttft-ms 100 --inter-token-ms 25""")
    p.add_argument("model_file", help="a .onnx, .pt (TorchScript) or .pt2 (torch.export) file, or a streaming "
                   "model's stream.json")
    p.add_argument("--runtime", choices=["onnx", "torchscript", "torch_export"],
                   help="override the runtime detected from the extension")
    p.add_argument("--input", action="append", metavar="NAME:DTYPE:DIMS", dest="inputs",
                   help="an input without the batch dimension, e.g. tokens:INT64:-1 (repeatable)")
    p.add_argument("--intra-op-threads", type=int, default=1, help="threads per call (default 1)")
    p.add_argument("--max-batch-size", type=int, default=256, help="largest batch tried (default 256)")
    p.add_argument("--lengths", help="comma-separated lengths for variable dimensions (default 8,16,..,max)")
    p.add_argument("--max-length", type=int, help="longest length for variable dimensions (default: config's "
                   "max_sequence_length, else 128)")
    p.add_argument("--max-latency-ms", type=float, default=2000.0,
                   help="stop a sweep once one call is, or would be, slower (default 2000; with --slo-ms at "
                        "most half the SLO, the slowest call that can fit it)")
    p.add_argument("--min-seconds", type=float, default=0.2, help="time spent measuring each point (default 0.2)")
    p.add_argument("--slo-ms", type=float, help="also derive and print the settings for this P99 SLO")
    p.add_argument("--no-calibrate", action="store_true",
                   help="skip measuring the serving cost on tritonserver (the derivation then assumes "
                        "--backend-overhead-ms per batch; for a streaming model, an assumed cost of a response)")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure the serving cost again (it is kept for a week, per machine: host, cores, "
                        "tritonserver, latte version)")
    p.add_argument("--backend-overhead-ms", type=float,
                   help="per-batch serving cost to derive with instead of the calibrated one")
    p.add_argument("--streams", help="a streaming model: comma-separated levels of live streams "
                   "(default 1,2,4,8,16,32,64)")
    p.add_argument("--max-tokens", type=int, help="a streaming model: outputs per stream (default 16)")
    p.add_argument("--ttft-ms", type=float, help="a streaming model: also derive settings for this P99 time to "
                   "first token (with --inter-token-ms)")
    p.add_argument("--inter-token-ms", type=float, help="a streaming model: the P99 inter-token SLO")
    p.add_argument("-o", "--out", default=".", help="output folder (default: current folder)")
    p.set_defaults(handler=_profile)

    p = sub.add_parser(
        "generate", formatter_class=_RAW,
        help="render a model repository (models, ensembles) from a pipeline spec",
        description="""\
Read the pipeline spec SPEC (YAML), derive each latte model's settings from its profile and
SLO (profiling it first when the spec names no profile), render config.pbtxt for every model
and ensemble from Jinja2 templates, copy model files into version folders, write warm-up
data, and validate the result as `latte validate` does.

Each ensemble's steps that latte can run (latte and python models on one device) are fused
into one latte model under the ensemble's name, which runs them in one process with no hop
through Triton between steps; the summary says what fused and why any step did not.
--no-fuse renders Triton's ensemble as written.

Spec outline (see docs/generator.md for every key):
  resources: {cores: 2, gpus: 0}
  models:
    - {name: pre, file: pre.py, inputs: [...], outputs: [...]}          # backend: python
    - {name: encoder, file: encoder.onnx, slo_ms: 50, profile: p.json}  # backend: latte
  ensembles:
    - name: pipeline
      inputs: [...]; outputs: [...]
      steps:
        - {model: pre, inputs: {MODEL_INPUT: tensor}, outputs: {MODEL_OUTPUT: tensor}}

Each derived number is printed with the reason it was chosen.""",
        epilog="""\
examples:
  latte generate pipeline.yaml -o repo/
  latte generate pipeline.yaml -o repo/ --templates my_templates/   # your config.pbtxt.j2 / ensemble.pbtxt.j2""")
    p.add_argument("spec", help="pipeline spec (YAML)")
    p.add_argument("-o", "--out", required=True, help="model repository folder to write")
    p.add_argument("--templates", metavar="DIR", help="folder with templates that replace the bundled ones by name "
                   "(config.pbtxt.j2 for models, ensemble.pbtxt.j2 for ensembles)")
    p.add_argument("--profiles", metavar="DIR", help="where profiles made during generate are kept "
                   "(default: profiles/ next to the spec)")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure this machine's serving cost again (it is kept for a week, per machine)")
    p.add_argument("--no-fuse", action="store_true",
                   help="render each ensemble as Triton's ensemble of separate models, as written, instead of "
                        "fusing the steps latte can run into one latte model (docs/pipelines.md)")
    p.set_defaults(handler=_generate)

    p = sub.add_parser(
        "fuse", formatter_class=_RAW,
        help="fuse an existing repository's ensemble into one latte model (no hop between its steps)",
        description="""\
Read the model repository REPO, and write OUT: a copy of it in which ENSEMBLE's steps run as one
`backend: "latte"` model, under the ensemble's name, so clients call what they called before.
Steps of backend python (their TritonPythonModel, unchanged, called in process), onnxruntime,
pytorch (TorchScript) and latte fuse; a step latte cannot run (another backend, another device,
a decoupled or sequence model) stays in Triton's ensemble around the fused ones, and the summary
says why. OUT is validated as `latte validate` does (docs/pipelines.md).""",
        epilog="""\
examples:
  latte fuse repo/ --ensemble embed_text -o fused-repo/
  latte fuse repo/ --ensemble classify_image -o fused-repo/ --samples images.json""")
    p.add_argument("repo", help="model repository folder holding the ensemble and its step models")
    p.add_argument("--ensemble", required=True, help="the ensemble to fuse")
    p.add_argument("-o", "--out", required=True, help="folder to write the fused repository to (new or empty)")
    p.add_argument("--samples", metavar="FILE", help="requests the first steps accept (perf_analyzer --input-data "
                   "JSON): the fused model checks its steps' tensors on them at load")
    p.add_argument("--templates", metavar="DIR", help="folder with templates that replace the bundled ones by name")
    p.set_defaults(handler=_fuse)

    p = sub.add_parser(
        "validate", formatter_class=_RAW,
        help="check configs (Triton's ModelConfig) and ensemble DAGs of a repository",
        description="""\
Parse every REPO/*/config.pbtxt with Triton's ModelConfig protobuf, check version folders hold
their model files, and check every ensemble: no cycles, every tensor produced once and
consumed, step inputs/outputs exist on the step's model with the same dtypes and shapes,
and the ensemble's own inputs and outputs are wired. Exits 1 listing every problem, each as
FILE:LINE: field: message on the config.pbtxt that holds it. Warns (exit 0) on a config that
Triton 2.51 serves with ~500 ms stalls: one instance behind a dynamic batcher with priority
levels or a queue policy limit.""",
        epilog="example:\n  latte validate repo/")
    p.add_argument("repo", help="model repository folder")
    p.set_defaults(handler=_validate)

    p = sub.add_parser(
        "verify", formatter_class=_RAW,
        help="serve a repository and check a model's P99 SLO with perf_analyzer",
        description="""\
Start tritonserver on REPO and drive MODEL with perf_analyzer at the load its settings are
for: Poisson arrivals at the rate `latte generate` planned (the spec's arrival_rate, else 80%
of the throughput the derivation promised at the SLO; kept in REPO/latte_plan.json), or
--rate, or a closed loop of --concurrency clients. Report P99 latency and throughput against
the SLO and, when it does not hold, suggest the one setting to change, from where the time
went (server queue vs compute).

A streaming (decoupled) model is driven instead by as many concurrent streams as its
max_streams (each client sends its next prompt when its stream ends), and held to its time
to first token and inter-token SLOs at P99 (the plan's, or --ttft-ms and --inter-token-ms).""",
        epilog="examples:\n  latte verify repo/ --model encoder\n  latte verify repo/ --model embed_text --slo-ms 50 --rate 200\n"
               "  latte verify repo/ --model textgen --ttft-ms 100 --inter-token-ms 25")
    p.add_argument("repo", help="model repository folder")
    p.add_argument("--model", required=True, help="model (or ensemble) to load")
    p.add_argument("--slo-ms", type=float, help="the P99 latency SLO in milliseconds (default: the planned one)")
    p.add_argument("--rate", type=float, help="Poisson arrivals per second (default: the planned rate)")
    p.add_argument("--concurrency", type=int, help="closed loop: requests in flight (instead of a rate); for a "
                   "streaming model, concurrent streams")
    p.add_argument("--ttft-ms", type=float, help="a streaming model's P99 time to first token SLO (default: the "
                   "planned one)")
    p.add_argument("--inter-token-ms", type=float, help="a streaming model's P99 inter-token SLO (default: the "
                   "planned one)")
    _add_length_flags(p)
    p.add_argument("--measurement-ms", type=int, default=3000, help="measurement window (perf_analyzer's, or the "
                   "streams')")
    p.add_argument("--url", metavar="HOST:PORT", help="gRPC endpoint of a tritonserver already serving REPO "
                   "(default: start one)")
    p.add_argument("--tritonserver", metavar="PATH", help="tritonserver binary or install root")
    p.add_argument("--backend-directory", metavar="DIR", help="folder holding Triton's python/ backend")
    p.set_defaults(handler=_verify)

    p = sub.add_parser(
        "tune", formatter_class=_RAW,
        help="measure the derived config's neighbours on tritonserver and keep the best",
        description="""\
Start tritonserver on REPO in explicit model-control mode and measure MODEL's config and its
neighbours, one setting changed at a time: instances +-1, max_batch_size x2 or /2, queue
delay, preferred batch sizes, queue policy. Each candidate is driven in closed loop (its
score: the best throughput with P99 within the SLO) and, when the repository has a plan,
with Poisson arrivals at the planned rate (P99 must hold there too). The search moves to
the best neighbour while it wins by more than 3% and stops otherwise; it prints a table,
rewrites REPO/MODEL/config.pbtxt with the winner and keeps the measurements next to the
model's profile (MODEL.tune.json).""",
        epilog="example:\n  latte tune repo/ --model encoder --slo-ms 50")
    p.add_argument("repo", help="model repository folder (from `latte generate`)")
    p.add_argument("--model", required=True, help="the latte model to tune")
    p.add_argument("--slo-ms", type=float, help="the P99 latency SLO in milliseconds (default: the planned one)")
    _add_length_flags(p)
    p.add_argument("--measurement-ms", type=int, default=1000, help="perf_analyzer measurement window")
    p.add_argument("--max-steps", type=int, default=4, help="moves to a better neighbour at most (default 4)")
    p.add_argument("--budget-s", type=float, metavar="SECONDS",
                   help="a measurement starts only when it should end within this many seconds of the start; "
                        "the best confirmed candidate wins (default: no limit)")
    p.add_argument("--dry-run", action="store_true", help="measure and print, leave config.pbtxt as it is")
    p.add_argument("--tritonserver", metavar="PATH", help="tritonserver binary or install root")
    p.add_argument("--backend-directory", metavar="DIR", help="folder holding Triton's python/ backend")
    p.set_defaults(handler=_tune)


def _length_distribution(text: str):
    from latte.bench.lengths import LengthDistribution, LengthSpecError

    try:
        return LengthDistribution.parse(text)
    except LengthSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def _add_length_flags(p) -> None:
    from latte.bench.lengths import EXAMPLES_TEXT

    lengths = p.add_mutually_exclusive_group()
    lengths.add_argument("--length", type=int, default=16, help="length used for variable input dimensions (default 16)")
    lengths.add_argument("--lengths", type=_length_distribution, metavar="DIST",
                         help="draw each request's variable dimensions from a length distribution instead, "
                              f"as the model will be served, e.g. {EXAMPLES_TEXT.split(', ')[2]}")


def _integers(flag: str, text: str):
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated integers, e.g. 16,64,128") from None


def _profile_stream(args) -> int:
    from latte.generator.derive_streams import derive_streams
    from latte.generator.stream_profile import DEFAULT_LEVELS, DEFAULT_MAX_TOKENS, profile_stream

    if (args.ttft_ms is None) != (args.inter_token_ms is None):
        raise ValueError("give both --ttft-ms and --inter-token-ms to derive a streaming model's settings")
    levels = _integers("--streams", args.streams) if args.streams else DEFAULT_LEVELS
    profile = profile_stream(Path(args.model_file), levels, args.max_tokens or DEFAULT_MAX_TOKENS,
                             args.intra_op_threads, log=print)
    if not args.no_calibrate:
        from latte.generator.stream_cost import machine_response_cost

        profile.responses = machine_response_cost(log=print, refresh=args.recalibrate)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = profile.save(out / "profile.json")
    print(f"wrote {path} ({profile.wall_s:.1f} s; {profile.stop_reason})")
    if args.ttft_ms is not None:
        print(derive_streams(profile, args.ttft_ms, args.inter_token_ms).report(Path(args.model_file).parent.parent.name
                                                                               or "model"))
    return 0


def _profile(args) -> int:
    from latte.backend.config import STREAM_FILE

    if Path(args.model_file).name == STREAM_FILE:
        return _profile_stream(args)
    for flag in ("streams", "max_tokens", "ttft_ms", "inter_token_ms"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} is for a streaming model's {STREAM_FILE}")
    from latte.generator.plot import plot_profile
    from latte.generator.profile import ProfileOptions, profile_model
    from latte.generator.shapes import parse_input_flag

    inputs = [parse_input_flag(text) for text in args.inputs or []]
    lengths = _integers("--lengths", args.lengths) if args.lengths else None
    opts = ProfileOptions(runtime=args.runtime, intra_op_threads=args.intra_op_threads, inputs=inputs or None,
                          max_batch_size=args.max_batch_size, lengths=lengths, max_length=args.max_length,
                          max_latency_ms=args.max_latency_ms, slo_ms=args.slo_ms, min_seconds=args.min_seconds)
    profile = profile_model(Path(args.model_file), opts, show_progress=sys.stderr.isatty())
    if not args.no_calibrate:
        from latte.generator.calibrate import machine_serving_cost

        profile.serving = machine_serving_cost(log=print, refresh=args.recalibrate)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = profile.save(out / "profile.json")
    png_path = plot_profile(profile, out / "profile.png", args.slo_ms)
    _print_profile(profile)
    print(f"wrote {json_path} and {png_path} ({profile.wall_s:.1f} s)")
    if args.slo_ms:
        from latte.generator.calibrate import ServingCost
        from latte.generator.config_summary import derivation_report
        from latte.backend.config import usable_cores
        from latte.generator.derive import DEFAULT_BACKEND_OVERHEAD_MS, derive

        if args.backend_overhead_ms is not None:
            serving = ServingCost.flat(args.backend_overhead_ms, "--backend-overhead-ms")
        else:
            serving = profile.serving or ServingCost.flat(DEFAULT_BACKEND_OVERHEAD_MS, "assumed: not calibrated")
        print(derivation_report(Path(args.model_file).stem, derive(profile, args.slo_ms, cores=usable_cores(),
                                                                    serving=serving)))
    return 0


def _print_profile(profile) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{Path(profile.model_file).name} ({profile.runtime}, "
                        f"intra_op_threads={profile.intra_op_threads})")
    for column in ("length", "batch", "mean ms", "P50 ms", "P99 ms", "rows/s", "peak MiB"):
        table.add_column(column, justify="right")
    for p in profile.points:
        table.add_row("-" if p.length is None else str(p.length), str(p.batch_size), f"{p.mean_ms:.3f}",
                      f"{p.p50_ms:.3f}", f"{p.p99_ms:.3f}", f"{p.throughput:.0f}", f"{p.peak_bytes / 2**20:.1f}")
    Console().print(table)
    for bucket, reason in profile.stop_reason.items():
        print(f"  sweep at {bucket}: stopped on {reason}")


def _generate(args) -> int:
    from latte.generator.config_summary import derivation_report
    from latte.generator.generate import generate

    plans = generate(Path(args.spec), Path(args.out), Path(args.templates) if args.templates else None,
                     Path(args.profiles) if args.profiles else None, log=print, recalibrate=args.recalibrate,
                     fuse=not args.no_fuse)
    for plan in plans:
        if plan.derivation is not None:
            print(derivation_report(plan.name, plan.derivation))
        if plan.stream_derivation is not None:
            print(plan.stream_derivation.report(plan.name))
    print(f"wrote {len(plans)} model(s) to {args.out}; validated")
    return 0


def _fuse(args) -> int:
    from latte.generator.fuse import fuse_repository

    fusion = fuse_repository(Path(args.repo), args.ensemble, Path(args.out),
                             Path(args.samples) if args.samples else None,
                             Path(args.templates) if args.templates else None)
    for line in fusion.summary():
        print(line)
    print(f"wrote {args.out}; validated")
    return 0


def _validate(args) -> int:
    from latte.generator.validate import RepositoryError, config_warnings, validate_repository

    try:
        configs = validate_repository(Path(args.repo))
    except RepositoryError as exc:
        print(f"{args.repo}: {len(exc.problems)} problem(s)", file=sys.stderr)
        for line in exc.problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    for config in configs.values():
        for warning in config_warnings(config):
            print(f"warning: {warning}", file=sys.stderr)
    ensembles = sum(1 for c in configs.values() if c.platform == "ensemble")
    print(f"{args.repo}: {len(configs)} model(s), {ensembles} ensemble(s): valid")
    return 0


def _verify(args) -> int:
    from latte.generator.verify import verify
    from latte.triton import find_triton

    install = None if args.url else find_triton(args.tritonserver, args.backend_directory)
    report = verify(Path(args.repo), args.model, args.slo_ms, install=install, concurrency=args.concurrency,
                    length=args.length, measurement_ms=args.measurement_ms, url=args.url, rate=args.rate,
                    lengths=args.lengths, ttft_ms=args.ttft_ms, itl_ms=args.inter_token_ms)
    print(report.text())
    return 0 if report.slo_met else 1


def _tune(args) -> int:
    from latte.generator.tune import tune
    from latte.triton import find_triton

    result = tune(Path(args.repo), args.model, args.slo_ms, install=find_triton(args.tritonserver,
                                                                               args.backend_directory),
                  length=args.length, measurement_ms=args.measurement_ms, max_steps=args.max_steps,
                  write=not args.dry_run, log=print, lengths=args.lengths, budget_s=args.budget_s)
    print(result.table())
    if result.best is not result.start and not args.dry_run and result.found:
        print(f"wrote {Path(args.repo) / args.model / 'config.pbtxt'}")
    return 0 if result.found else 1
