"""`latte install-backend`, `latte serve`, `latte examples`, `latte demo`."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path


def _add_triton_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tritonserver", metavar="PATH",
                   help="an existing tritonserver binary or install root (e.g. /opt/tritonserver); "
                        "default: the one bundled in nvidia-pytriton")
    p.add_argument("--backend-directory", metavar="DIR",
                   help="the folder holding Triton's python/ backend for --tritonserver "
                        "(default: <install root>/backends)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("install-backend", help="lay out a Triton backend directory that serves backend: \"latte\"",
                       description="Copy Triton's Python backend, the stub for this interpreter and latte's "
                                   "model.py into DIR, ready for `tritonserver --backend-directory DIR`.")
    p.add_argument("dir", nargs="?", help="destination (default: <venv>/share/latte/backends)")
    _add_triton_args(p)
    p.set_defaults(handler=_install_backend)

    p = sub.add_parser("serve", help="start tritonserver on a model repository and wait for Ctrl-C",
                       usage="latte serve [options] REPO [-- TRITONSERVER_FLAGS...]",
                       description="Start a real tritonserver on REPO with latte's backend, print the "
                                   "endpoints once every model is ready, and stop cleanly on Ctrl-C or SIGTERM. "
                                   "Flags after `--` go to tritonserver unchanged, e.g. "
                                   "`latte serve repo -- --log-verbose=1 --backend-config=python,shm-default-byte-size=16777216`.")
    p.add_argument("repo", help="model repository folder")
    p.add_argument("--http-port", type=int, default=8000, help="HTTP/REST port")
    p.add_argument("--grpc-port", type=int, default=8001, help="gRPC port")
    p.add_argument("--metrics-port", type=int, default=8002, help="Prometheus metrics port (nv_* and latte_*)")
    p.add_argument("--address", default="127.0.0.1",
                   help="where HTTP, gRPC and metrics listen (default: 127.0.0.1, this machine only). Off loopback "
                        "(e.g. 0.0.0.0), Triton's administrative APIs (shared memory, model repository, logging, "
                        "trace) answer only requests with the header latte-admin-key: TOKEN; inference does not "
                        "need it")
    p.add_argument("--access-token", metavar="TOKEN",
                   help="the value of the latte-admin-key header (default off loopback: a random one, printed)")
    p.add_argument("--open-admin-apis", action="store_true",
                   help="off loopback, leave Triton's administrative APIs open to anyone who reaches the server")
    p.add_argument("--log", metavar="FILE", help="server log file (default: a temporary file)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for readiness")
    p.add_argument("--keep-going", action="store_true",
                   help="serve the models that load when others fail, and list each failed one with its error")
    p.add_argument("--health-port", type=int, default=8003,
                   help="port of latte's own endpoint: /ready (every model serving, or which is not and why), "
                        "/live, /metrics (restarts) and POST /models/NAME/rejuvenate")
    p.add_argument("--state-dir", metavar="DIR",
                   help="where what must outlive a model's process is kept: sessions' last turns, the inputs in "
                        "flight at a crash (default: a new temporary folder)")
    p.add_argument("--max-restarts", type=int, default=5,
                   help="restarts of one model within --restart-window before it is given up")
    p.add_argument("--restart-window", type=float, default=600.0, metavar="SECONDS",
                   help="the window --max-restarts counts in")
    p.add_argument("--execute-timeout", type=float, metavar="SECONDS",
                   help="an execute running longer counts as a hang: its instance is killed and reloaded "
                        "(default: the model's parameter execute_timeout_s, else 60)")
    p.add_argument("--response-cache-size", metavar="SIZE",
                   help="bytes of Triton's response cache, e.g. 256Mi; 0 for none (default: 256Mi when a model's "
                        "config has response_cache { enable: true }, none otherwise)")
    _add_triton_args(p)
    p.set_defaults(handler=_serve, passthrough=[])

    p = sub.add_parser("examples", help="build the example models (MLP, CNN, sequence) and their repository",
                       description="Build small example models locally (no downloads), export each to "
                                   "TorchScript and ONNX, and write a model repository serving them with "
                                   "backend: \"latte\". With --pipeline, write the example pipeline spec "
                                   "(tokenizer -> encoder -> normalizer) that docs/generator.md walks through instead; "
                                   "with --streaming, a repository of the streaming text generators (docs/streaming.md).")
    p.add_argument("dir", help="output folder for the model repository (or the pipeline's files)")
    p.add_argument("--pipeline", nargs="?", const="text", choices=["text", "image", "branching"],
                   help="write an example pipeline's DIR/pipeline.yaml and its files, for `latte generate "
                        "DIR/pipeline.yaml -o REPO`: text (the default), image or branching (docs/pipelines.md)")
    p.add_argument("--streaming", action="store_true",
                   help="write the streaming text generators instead: textgen (a transformer), textgen_gru (a "
                        "recurrent decoder) and textgen_stock (the transformer in a stock decoupled Python model), "
                        "and DIR/streams.yaml, a spec of the first two with their SLOs for `latte generate`")
    p.set_defaults(handler=_examples)

    p = sub.add_parser("demo", help="run Latte end to end: examples, server, requests, a short benchmark",
                       description="Build the examples, start tritonserver, answer real HTTP and gRPC "
                                   "requests, run a short perf_analyzer measurement and stop the server.")
    p.add_argument("--workdir", default=".latte/demo", help="where the demo repository is written")
    _add_triton_args(p)
    p.set_defaults(handler=_demo)


def _install(args):
    from latte.triton import find_triton

    return find_triton(args.tritonserver, args.backend_directory)


def _install_backend(args) -> int:
    from latte.triton import install_backend
    from latte.triton.server import default_backend_directory

    dest = install_backend(Path(args.dir) if args.dir else default_backend_directory(), _install(args))
    print(f"backend directory ready: {dest}")
    print(f"  start a server on it: latte tritonserver --backend-directory {dest} --model-repository REPO")
    if not args.dir:
        from latte.triton.perf import install_perf_analyzer_wrapper

        wrapper = install_perf_analyzer_wrapper()
        if wrapper is not None:
            print(f"perf_analyzer ready: {wrapper} (or: latte perf-analyzer ARGS...)")
    return 0


def _access_token(args):
    """The admin header's value: given, made up off loopback, or none (loopback, or left open)."""
    from latte.triton.security import is_loopback, new_access_token, restricted_api_args

    if args.open_admin_apis:
        if args.access_token:
            raise ValueError("--access-token and --open-admin-apis contradict each other; pass one of them")
        return None
    if args.access_token:
        restricted_api_args(args.access_token)  # refuses a token tritonserver's flag cannot carry
        return args.access_token
    return None if is_loopback(args.address) else new_access_token()


def _supervised_flags(passthrough) -> list:
    """tritonserver's flags with every model loaded in explicit model-control mode, which lets
    the supervisor reload a model; a mode the caller chose is kept (then nothing is reloaded)."""
    if any(flag.startswith("--model-control-mode") for flag in passthrough):
        return list(passthrough)
    return ["--model-control-mode=explicit", "--load-model=*", *passthrough]


def _serve(args) -> int:
    from latte.supervision.policy import RestartPolicy
    from latte.supervision.state import STATE_DIR_ENV
    from latte.triton import TritonServer
    from latte.triton.cache import parse_size
    from latte.triton.security import is_loopback

    cache = parse_size(args.response_cache_size) if args.response_cache_size is not None else None
    token = _access_token(args)
    policy = RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window)
    state_dir = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="latte-state-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    flags = _supervised_flags(args.passthrough)
    server = TritonServer(args.repo, install=_install(args), http_port=args.http_port,
                          grpc_port=args.grpc_port, metrics_port=args.metrics_port, log_path=args.log,
                          extra_args=flags, keep_going=args.keep_going, response_cache_bytes=cache,
                          address=args.address, admin_token=token,
                          environment={STATE_DIR_ENV: str(state_dir.resolve())})
    stop = {"now": False}

    def _on_signal(signum, _frame):
        stop["now"] = True

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    print(f"starting tritonserver on {server.repository} (log: {server.log_path})", flush=True)
    if server.response_cache_bytes:
        print(f"response cache: {server.response_cache_bytes} bytes", flush=True)
    server.start(timeout=args.timeout)
    failed = server.failed_models() if args.keep_going else []
    for model, reason in failed:
        print(f"not serving {model}: {reason.strip().splitlines()[0] if reason.strip() else 'failed to load'}",
              file=sys.stderr, flush=True)
    print(f"ready  http://{server.http_url}  grpc {server.grpc_url}  metrics {server.metrics_url}"
          + (f"  ({len(failed)} model(s) not served, listed above)" if failed else ""), flush=True)
    if token:
        from latte.triton.security import ADMIN_APIS, ADMIN_HEADER, GRPC_ADMIN_HEADER

        print(f"listening on {args.address}: {', '.join(ADMIN_APIS)} need the header {ADMIN_HEADER}: {token} "
              f"(over gRPC: {GRPC_ADMIN_HEADER}); inference does not", flush=True)
    elif not is_loopback(args.address):
        print(f"listening on {args.address} with Triton's administrative APIs open to anyone who reaches it "
              "(--open-admin-apis)", flush=True)
    supervisor, health = _supervise(server, args, policy, state_dir, token, reloads="--load-model=*" in flags)
    try:
        return _keep_serving(server, stop, health, policy, args)
    finally:
        health.stop()
        health.supervisor.stop()
        code = server.stop(stuck_models=health.supervisor.dead_copies)
        print(f"tritonserver stopped (exit code {code})", flush=True)
        for what, seconds in server.stop_waited:
            print(f"  it waited {seconds} s for {what} (tritonserver's words); pass -- --exit-timeout-secs=N "
                  "to bound that wait", flush=True)


def _exit_words(code: int) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _keep_serving(server, stop, health, policy, args) -> int:
    """Serve until Ctrl-C or SIGTERM. A tritonserver that exits by itself (Triton 2.51's Python
    backend aborts the whole server when a stub dies holding a lock it shares with it) is
    started again with every model, under the same restart policy as a model; past it, latte
    serve exits 1 and its container is restarted."""
    from latte.supervision.policy import RestartBudget
    from latte.triton.server import ServerStartError

    budget = RestartBudget(policy)
    while not stop["now"]:
        if server.is_alive():
            time.sleep(0.2)
            continue
        now = time.monotonic()
        delay = budget.next_delay(now)
        why = f"latte supervisor: tritonserver {_exit_words(server.process.returncode)}; log: {server.log_path}"
        if delay is None:
            _event(server, f"{why}; gave up after {policy.max_restarts} restarts of it in {policy.window_s:g} s")
            return 1
        budget.spend(now)
        _event(server, f"{why}; starting it again with every model in {delay:g} s "
                       f"(restart {budget.used(now)} of {policy.max_restarts} in {policy.window_s:g} s)")
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and not stop["now"]:
            time.sleep(0.1)
        if stop["now"]:
            break
        old = health.supervisor
        old.stop()
        server.stop(grace=5.0)  # the stubs left in its process group go too
        started = time.monotonic()
        try:
            server.start(timeout=args.timeout, fresh_log=False)
        except ServerStartError as exc:
            _event(server, f"latte supervisor: tritonserver did not start again: {str(exc).splitlines()[0]}")
            continue
        health.supervisor = _new_supervisor(server, args, old.policy, old.state_dir, restarts=old.restarts,
                                            server_restarts=old.server_restarts + 1)
        _event(server, f"latte supervisor: tritonserver serving again with {len(health.supervisor.models)} "
                       f"model(s) in {time.monotonic() - started:.1f} s")
    return 0


def _event(server, line: str) -> None:
    print(line, file=sys.stderr, flush=True)
    server.append_log(line)


def _new_supervisor(server, args, policy, state_dir: Path, **carried):
    from latte.supervision.supervisor import Supervisor

    return Supervisor(server, policy, state_dir, execute_timeout_s=args.execute_timeout,
                      log=lambda line: _event(server, line), **carried).start()


def _supervise(server, args, policy, state_dir: Path, token, reloads: bool):
    """Start the supervisor of every model and latte's health endpoint; print where it is."""
    from latte.supervision.health import HealthEndpoint
    from latte.supervision.policy import RestartPolicy

    if not reloads:
        _event(server, "latte supervisor: tritonserver runs in the model-control mode given after --; a model "
                       "that dies is reported (readiness, metrics) but not reloaded")
        policy = RestartPolicy(max_restarts=0, window_s=policy.window_s)
    supervisor = _new_supervisor(server, args, policy, state_dir)
    health = HealthEndpoint(supervisor, args.address, args.health_port, token).start()
    host = server.http_url.rsplit(":", 1)[0]
    print(f"supervising {len(supervisor.models)} model(s): readiness http://{host}:{health.port}/ready  "
          f"liveness /live  metrics /metrics  (state: {state_dir})", flush=True)
    return supervisor, health


def _examples(args) -> int:
    from latte.examples import build_examples

    if args.pipeline:
        from latte.examples.pipeline import write_pipeline

        spec = write_pipeline(Path(args.dir), name=args.pipeline)
        print(f"example {args.pipeline} pipeline written to {spec}")
        print(f"  next: latte generate {spec} -o REPO")
        return 0
    if args.streaming:
        from latte.examples.streams import write_stock_model, write_stream_model, write_stream_spec

        repo = Path(args.dir)
        write_stream_model(repo, "textgen", "gpt")
        write_stream_model(repo, "textgen_gru", "gru")
        write_stock_model(repo, "textgen_stock", "gpt")
        spec = write_stream_spec(repo)
        print(f"streaming examples written to {repo}: textgen, textgen_gru, textgen_stock, and their spec {spec}")
        print(f"  next: latte serve {repo}, or latte generate {spec} -o REPO --profiles PROFILES to derive their "
              "settings from SLOs (profiles kept outside the repository Triton serves)")
        return 0
    repo = build_examples(Path(args.dir))
    print(f"example repository written to {repo}")
    return 0


def _demo(args) -> int:
    from latte.demo import run_demo

    return run_demo(Path(args.workdir), _install(args))
