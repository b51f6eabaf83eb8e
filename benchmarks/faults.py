"""Faults benchmark: `kill -9` of a model's process under load, and rejuvenation under load.

    .venv/bin/python benchmarks/faults.py                        # 10 kills of each model, 3 rejuvenations
    .venv/bin/python benchmarks/faults.py --faults 3 --rejuvenations 1 --soak-requests 100000

Serves the examples and a stock Python model of the MLP (`mlp_stock`, Triton's own Python
backend) with `latte serve`, which supervises them, with a restart window (--restart-window,
8 s) shorter than the time between two kills of one model: each kill is then a first death,
restarted at once, as a model that dies once in a while is; the growing delays of a model that
dies again soon after are the crash-loop part's, on a server of its own with the default policy. For each fault, --clients threads send
requests to one model back to back; after a steady second the model's stub is killed with
SIGKILL. The supervisor's readiness (/ready on its health port) is read every 20 ms. Per fault:
when readiness went false (detection), when the model answered again, when readiness came back,
how many requests failed and whether each failure was in flight at the kill or sent during the
recovery, and the longest any request waited. The models take turns, fault by fault.

Then rejuvenation: --rejuvenate-clients threads on `sequence_torchscript`, a steady window, a
rejuvenation asked for through the health endpoint (a new copy loads while the old one serves),
and the window across the swap: failed requests and P99 against the steady window's.

Then a poison input: --clients threads send good requests to `faulty` (a latte model whose
Python step segfaults on X = -1, latte.examples.fault_models) while one more sends X = -1 after
each recovery: it crashes the model twice, then is refused; the share of good requests that
succeeded over the part. Last, a crash loop: X = -1 to `faulty_stock` (a stock Python model,
whose inputs latte cannot refuse) after each recovery, until the supervisor gives it up, while
--clients threads keep sending to `mlp_onnx`, which must not notice.

Then a soak: --soak-requests requests to `mlp_onnx` from --clients threads, its process killed
every --kill-every seconds: every request answered, failures only in the recoveries, and the
survivors' memory (tritonserver and the other models' processes) from the first kill to the end.

Writes .latte/faults/faults.json and benchmarks/results/faults.json, from which
docs/benchmarks.md is rendered (`.venv/bin/python -m latte.bench.page`), with a timeline of the
first fault.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from latte.bench.quiet import wait_until_quiet
from latte.bench.results import Chart, Series, Table, Target, command_line, new_results, write_summary
from latte.examples import EXAMPLES, build_examples, write_served_copy
from latte.examples.fault_models import CRASH, LATTE_MODEL, STOCK_MODEL, write_fault_models
from latte.supervision import processes
from latte.triton.server import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LATTE = Path(sys.executable).with_name("latte")
STOCK = "mlp_stock"
INPUTS = {"sequence_torchscript": ("tokens", lambda: np.arange(1, 9, dtype=np.int64)[None]),
          "mlp_onnx": ("features", lambda: np.ones((1, 16), np.float32)),
          STOCK: ("features", lambda: np.ones((1, 16), np.float32)),
          LATTE_MODEL: ("X", lambda: np.array([[5]], np.int64)),
          STOCK_MODEL: ("X", lambda: np.array([[5]], np.int64))}
HANG_S = 30.0


class Serve:
    """`latte serve` on the repository, its ports and its log."""

    def __init__(self, repo: Path, out: Path, flags=(), name: str = "latte-serve") -> None:
        self.ports = {k: free_port() for k in ("http", "grpc", "metrics", "health")}
        self.log = out / f"{name}.log"
        # A run's state starts empty: inputs a run before blamed are not this run's.
        shutil.rmtree(out / f"{name}-state", ignore_errors=True)
        self.server_log = out / f"{name}-tritonserver.log"
        cmd = [str(LATTE), "serve", str(repo), "--log", str(self.server_log), "--state-dir", str(out / f"{name}-state"),
               *[a for k, v in self.ports.items() for a in (f"--{k}-port", str(v))], *flags,
               "--", "--exit-timeout-secs=5"]
        self.process = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while "supervising" not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"latte serve did not start; see {self.log}")
            time.sleep(0.2)
        self.http = f"127.0.0.1:{self.ports['http']}"
        self.health = f"http://127.0.0.1:{self.ports['health']}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.health + "/ready", timeout=1.0) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def server_restarts(self) -> int:
        text = urllib.request.urlopen(self.health + "/metrics", timeout=2.0).read().decode()
        match = re.search(r"^latte_server_restarts_total (\d+)", text, re.MULTILINE)
        return int(match.group(1)) if match else 0

    def restarts(self, model: str, reason: str) -> int:
        text = urllib.request.urlopen(self.health + "/metrics", timeout=2.0).read().decode()
        match = re.search(rf'latte_model_restarts_total{{model="{model}",reason="{reason}"}} (\d+)', text)
        return int(match.group(1)) if match else 0

    def model_state(self, model: str) -> str:
        try:
            with urllib.request.urlopen(self.health + "/ready", timeout=1.0) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
        return body.get("not_serving", {}).get(model, {}).get("status", "serving")

    def send_one(self, model: str, value: int) -> str:
        """One request of X = value: 'ok', or the error's HTTP status and first words."""
        import tritonclient.http as http

        client = http.InferenceServerClient(self.http, network_timeout=HANG_S * 2)
        tensor = http.InferInput("X", [1, 1], "INT64")
        tensor.set_data_from_numpy(np.array([[value]], np.int64))
        try:
            client.infer(model, [tensor])
            return "ok"
        except Exception as exc:
            return str(exc)[:120]
        finally:
            client.close()

    def stub_pid(self, model: str) -> int:
        server = next(pid for pid in processes.children(self.process.pid))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = [pid for pid, stub in processes.live_stubs(server).items() if stub.model == model]
            if found:
                return max(found)  # the newest copy's, where the replaced one is still leaving
            time.sleep(0.1)
        raise RuntimeError(f"no process of {model} to kill")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


class Load:
    """`clients` threads sending one model's request back to back; every request's send and
    answer times and outcome are kept."""

    def __init__(self, url: str, model: str, clients: int, pause_s: float = 0.0) -> None:
        self.url, self.model, self.pause_s = url, model, pause_s
        self.records = []   # (sent, answered, ok)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def _client(self) -> None:
        import tritonclient.http as http

        client = http.InferenceServerClient(self.url, network_timeout=HANG_S * 2)
        name, make = INPUTS[self.model]
        data = make()
        tensor = http.InferInput(name, list(data.shape), "INT64" if data.dtype == np.int64 else "FP32")
        tensor.set_data_from_numpy(data)
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                client.infer(self.model, [tensor])
                ok = True
            except Exception:
                ok = False
            with self._lock:
                self.records.append((sent, time.monotonic(), ok))
            if self.pause_s:
                self._stop.wait(self.pause_s)
        client.close()

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(HANG_S * 2)


def watch_readiness(serve: Serve, until: threading.Event, seen: list) -> None:
    while not until.is_set():
        seen.append((time.monotonic(), serve.ready()))
        time.sleep(0.02)


def one_fault(serve: Serve, model: str, clients: int, steady_s: float = 1.0, after_s: float = 1.5) -> dict:
    servers_before = serve.server_restarts()
    figures = _one_fault(serve, model, clients, steady_s, after_s)
    figures["server_restarted"] = serve.server_restarts() > servers_before
    return figures


def _one_fault(serve: Serve, model: str, clients: int, steady_s: float, after_s: float) -> dict:
    readiness, done = [], threading.Event()
    watcher = threading.Thread(target=watch_readiness, args=(serve, done, readiness), daemon=True)
    with Load(serve.http, model, clients) as load:
        time.sleep(steady_s)
        pid = serve.stub_pid(model)
        watcher.start()
        time.sleep(0.1)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        deadline = killed + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
            later = [r for r in readiness if r[0] > killed]
            if any(not ok for _, ok in later) and later[-1][1]:
                break
        time.sleep(after_s)
    done.set()
    watcher.join()
    return fault_figures(load.records, readiness, killed)


def fault_figures(records, readiness, killed: float) -> dict:
    after = [(t, ok) for t, ok in readiness if t > killed]
    down = next((t for t, ok in after if not ok), None)
    back = next((t for t, ok in after if ok and down is not None and t > down), None)
    served = next((a for s, a, ok in sorted(records, key=lambda r: r[1]) if ok and s > killed), None)
    failed = [(s, a) for s, a, ok in records if not ok]
    window_end = (max(back or killed, served or killed)) + 1.0
    return dict(
        requests=len(records), failed=len(failed),
        failed_outside=sum(1 for s, a in failed if not (s <= window_end and a >= killed - 0.05)),
        in_flight_at_kill=sum(1 for s, a, ok in records if s <= killed <= a),
        detection_s=round(down - killed, 3) if down else None,
        serving_again_s=round(served - killed, 3) if served else None,
        ready_again_s=round(back - killed, 3) if back else None,
        longest_answer_s=round(max((a - s for s, a, _ in records), default=0.0), 3),
        timeline=timeline(records, readiness, killed),
    )


def timeline(records, readiness, killed: float, bin_s: float = 0.1) -> dict:
    start, end = killed - 1.0, max(a for _, a, _ in records)
    bins = int((end - start) / bin_s) + 1
    ok, bad = [0] * bins, [0] * bins
    for _, answered, success in records:
        if answered >= start:
            (ok if success else bad)[int((answered - start) / bin_s)] += 1
    ready = [(round(t - killed, 3), int(r)) for t, r in readiness]
    return dict(bin_s=bin_s, start_s=-1.0, answered=ok, failed=bad, ready=ready)


def rejuvenation(serve: Serve, model: str, clients: int, steady_s: float = 3.0) -> dict:
    before = serve.restarts(model, "rejuvenated")
    with Load(serve.http, model, clients) as load:
        time.sleep(steady_s)
        asked = time.monotonic()
        request = urllib.request.Request(f"{serve.health}/models/{model}/rejuvenate", data=b"", method="POST")
        urllib.request.urlopen(request, timeout=5).read()
        while serve.restarts(model, "rejuvenated") == before and time.monotonic() - asked < 120:
            time.sleep(0.1)
        swapped = time.monotonic()
        time.sleep(1.0)
    steady = [a - s for s, a, ok in load.records if asked - steady_s + 1.0 <= s < asked]
    across = [(a - s) for s, a, ok in load.records if asked <= s <= swapped + 1.0]
    return dict(requests=len(load.records), failed=sum(1 for *_, ok in load.records if not ok),
                swap_s=round(swapped - asked, 2),
                steady_p99_ms=round(float(np.percentile(steady, 99)) * 1000, 2),
                across_p99_ms=round(float(np.percentile(across, 99)) * 1000, 2),
                across_requests=len(across))


def wait_serving(serve: Serve, model: str, within_s: float = 60.0) -> str:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        state = serve.model_state(model)
        if state in ("serving", "down"):
            return state
        time.sleep(0.05)
    return serve.model_state(model)


def poison(serve: Serve, clients: int, run_s: float, tries: int = 4) -> dict:
    """Paced good requests (a client's next 10 ms after its answer, as a service's callers send,
    not a flood that a quick error feeds) to `faulty` and to `mlp_onnx` for `run_s` seconds;
    X = -1 sent to `faulty` `tries` times, spread over the run, each after the model serves again."""
    answers = []
    crashes_before = serve.restarts(LATTE_MODEL, "died")
    started = time.monotonic()
    with Load(serve.http, LATTE_MODEL, clients, pause_s=0.01) as load, \
            Load(serve.http, "mlp_onnx", clients, pause_s=0.01) as others:
        for i in range(tries):
            time.sleep(max(0.0, started + (i + 1) * run_s / (tries + 1) - time.monotonic()))
            wait_serving(serve, LATTE_MODEL)
            answers.append(serve.send_one(LATTE_MODEL, CRASH))
        time.sleep(max(1.0, started + run_s - time.monotonic()))
    def share(records):
        return dict(requests=len(records), succeeded=sum(1 for *_, ok in records if ok))
    return dict(poison_answers=answers, crashes=serve.restarts(LATTE_MODEL, "died") - crashes_before,
                run_s=round(time.monotonic() - started, 1), same_model=share(load.records),
                whole_server=share(load.records + others.records),
                refused_after=next((i for i, a in enumerate(answers) if "refused this input" in a), None))


def crash_loop(serve: Serve, clients: int, limit: int = 20) -> dict:
    """X = -1 to `faulty_stock` after each recovery until it is given up; `mlp_onnx` under load."""
    sent = 0
    started = time.monotonic()
    with Load(serve.http, "mlp_onnx", clients) as load:
        while sent < limit and wait_serving(serve, STOCK_MODEL) != "down":
            serve.send_one(STOCK_MODEL, CRASH)
            sent += 1
            time.sleep(0.3)
        given_up = serve.model_state(STOCK_MODEL) == "down"
        seconds = time.monotonic() - started
        time.sleep(1.0)
    others = load.records
    return dict(crashes_sent=sent, given_up=given_up, seconds_to_give_up=round(seconds, 1),
                restarts=serve.restarts(STOCK_MODEL, "died"), gave_up=serve.restarts(STOCK_MODEL, "gave_up"),
                others_requests=len(others), others_failed=sum(1 for *_, ok in others if not ok),
                server_alive=serve.process.poll() is None)


def kill_soak(serve: Serve, model: str, clients: int, requests: int, every_s: float) -> dict:
    """`clients` threads on `model` until `requests` were answered, its stub killed every
    `every_s` seconds; the survivors' memory (tritonserver and the other models' stubs) read
    at every kill, the first reading against the last."""
    readiness, done = [], threading.Event()
    watcher = threading.Thread(target=watch_readiness, args=(serve, done, readiness), daemon=True)
    kills, survivors = [], []
    with Load(serve.http, model, clients) as load:
        watcher.start()
        started = time.monotonic()
        next_kill = started + every_s
        while len(load.records) < requests and time.monotonic() - started < 3600:
            time.sleep(0.1)
            if time.monotonic() >= next_kill:
                survivors.append(survivors_rss(serve, model))
                pid = serve.stub_pid(model)
                kills.append(time.monotonic())
                os.kill(pid, signal.SIGKILL)
                next_kill += every_s
        survivors.append(survivors_rss(serve, model))
    done.set()
    watcher.join()
    records = load.records
    windows = recovery_windows(readiness, kills)
    outside = [(s, a) for s, a, ok in records if not ok and not any(k - 0.05 <= a and s <= end + 1.0
                                                                    for k, end in windows)]
    return dict(requests=len(records), failed=sum(1 for *_, ok in records if not ok), failed_outside=len(outside),
                kills=len(kills), seconds=round(time.monotonic() - started, 1),
                recovery_s=[round(end - k, 2) for k, end in windows],
                longest_answer_s=round(max(a - s for s, a, _ in records), 3),
                survivors_rss_mb=[round(r / 2**20, 1) for r in survivors],
                survivors_rss_growth=round(survivors[-1] / survivors[0] - 1, 4) if survivors and survivors[0] else None)


def recovery_windows(readiness, kills):
    """(kill, readiness back) for each kill."""
    windows = []
    for k in kills:
        after = [(t, ok) for t, ok in readiness if t > k]
        down = next((t for t, ok in after if not ok), k)
        back = next((t for t, ok in after if ok and t > down), after[-1][0] if after else k)
        windows.append((k, back))
    return windows


def survivors_rss(serve: Serve, killed_model: str) -> int:
    """tritonserver's RSS and its stubs' but the killed model's."""
    server = processes.children(serve.process.pid)[0]
    stubs = [pid for pid, stub in processes.live_stubs(server).items() if stub.model != killed_model]
    return processes.rss_bytes(server) + sum(processes.rss_bytes(pid) for pid in stubs)


def reload_seconds(server_log: Path) -> dict:
    """Each model's reload times, from the supervisor's lines in the server log."""
    found = {}
    for model, seconds in re.findall(r"model '(\w+)' serving again: \w+ copy replaced in ([\d.]+) s",
                                     server_log.read_text(errors="replace")):
        found.setdefault(model, []).append(float(seconds))
    return found


def median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def summarize_soak(soak: dict, tables: list, targets: list) -> None:
    if not soak:
        return
    held = soak["failed_outside"] == 0 and soak["longest_answer_s"] < 30 and \
        soak["survivors_rss_growth"] is not None and soak["survivors_rss_growth"] <= 0.02
    targets.append(Target(
        f"a soak of {soak['requests']:,} requests with a kill -9 every {soak['every_s']:g} s: every request answered, "
        "failures only in the recoveries, the survivors' RSS flat (<= 2 %)",
        f"{soak['kills']} kills; {soak['failed']:,} failed, {soak['failed_outside']} outside the recoveries; longest "
        f"answer {soak['longest_answer_s']} s; survivors {soak['survivors_rss_growth']:+.1%}",
        "yes" if held else "no"))
    tables.append(Table(f"Soak of {soak['model']} with a kill -9 every {soak['every_s']:g} s",
                        ["requests", "seconds", "kills", "failed", "recoveries s", "survivors' RSS MiB, first -> last"],
                        [[f"{soak['requests']:,}", str(soak["seconds"]), str(soak["kills"]), f"{soak['failed']:,}",
                          ", ".join(str(r) for r in soak["recovery_s"]),
                          f"{soak['survivors_rss_mb'][0]} -> {soak['survivors_rss_mb'][-1]}"]]))


def summarize_poison(p: dict, loop: dict, tables: list, targets: list) -> None:
    if p:
        same, whole = p["same_model"], p["whole_server"]
        share = same["succeeded"] / max(1, same["requests"])
        server_share = whole["succeeded"] / max(1, whole["requests"])
        refused = p["refused_after"]
        lost = same["requests"] - same["succeeded"]
        met = refused == 2 and p["crashes"] == 2
        targets.append(Target(
            "poison: a segfaulting input refused after its second crash; >= 99 % of the other requests succeed",
            f"refused at try {refused + 1 if refused is not None else '-'} after {p['crashes']} crashes; "
            f"{share:.2%} of {same['requests']:,} to the same model, {server_share:.2%} of {whole['requests']:,} "
            f"to the server, over {p['run_s']:g} s",
            "yes" if met and share >= 0.99 else "partly" if met and server_share >= 0.99 else "no",
            "" if share >= 0.99 else
            f"each of the two crashes leaves the model answering nothing while its new copy loads: the "
            f"{lost:,} requests lost are those of the two recoveries; at this rate 99 % of the model's own "
            f"requests needs a run 100x the recoveries' length"))
        tables.append(Table("A poison input to `faulty` (a latte model), one try after each recovery",
                            ["try", "answer"], [[str(i + 1), a] for i, a in enumerate(p["poison_answers"])]))
    if loop:
        held = loop["given_up"] and loop["others_failed"] == 0 and loop["server_alive"]
        targets.append(Target("crash loop: given up after its restarts; the server and the other models unaffected",
                              f"given up after {loop['restarts']} restarts in {loop['seconds_to_give_up']} s; "
                              f"mlp_onnx {loop['others_failed']} failed of {loop['others_requests']:,}",
                              "yes" if held else "no"))


def summarize(per_model: dict, rejuvenations: list, reloads: dict, args, p: dict = None, loop: dict = None,
              soak: dict = None) -> dict:
    rows, targets = [], []
    for model, faults in per_model.items():
        load_s = median(reloads.get(model, []))
        bound = 3.0 if load_s is not None and load_s < 2.0 else 5.0
        again = median([f["serving_again_s"] for f in faults])
        rows.append([model, str(len(faults)), f"{median([f['detection_s'] for f in faults])}",
                     f"{max((f['detection_s'] or 99) for f in faults)}", f"{again}", f"{load_s}",
                     f"{median([f['ready_again_s'] for f in faults])}",
                     f"{median([f['failed'] for f in faults])} (in flight at kill {median([f['in_flight_at_kill'] for f in faults])})",
                     str(sum(f["failed_outside"] for f in faults)),
                     f"{max(f['longest_answer_s'] for f in faults)}"])
        targets.append(Target(f"{model}: serving again within {bound:g} s of a kill -9 (median of {len(faults)})",
                              f"{again} s (reload {load_s} s)", "yes" if again is not None and again <= bound else "no",
                              "" if again is not None and again <= bound else "the reload itself takes this long"))
    aborted = [(m, f) for m, faults in per_model.items() for f in faults if f.get("server_restarted")]
    kills = sum(len(faults) for faults in per_model.values())
    targets.append(Target(
        "a kill -9 of a stub takes only its own model down", f"tritonserver aborted at {len(aborted)} of {kills} kills"
        + (f"; latte serve started it again, serving {median([f['serving_again_s'] for _, f in aborted])} s "
           "after the kill (median)" if aborted else ""),
        "yes" if not aborted else "partly",
        "" if not aborted else "Triton 2.51's Python backend aborts the whole server (boost::interprocess::"
        "lock_exception in ModelInstanceExecute) when a request reaches a stub that died holding the lock they "
        "share; latte serve restarts tritonserver with every model, as it restarts a model"))
    detections = [f["detection_s"] for faults in per_model.values() for f in faults]
    targets.append(Target("death seen (readiness false) within 1 s", f"max {max(d or 99 for d in detections)} s",
                          "yes" if all(d is not None and d <= 1.0 for d in detections) else "no"))
    lag = [abs((f["ready_again_s"] or 99) - (f["serving_again_s"] or 0)) for faults in per_model.values() for f in faults]
    targets.append(Target("readiness true within 1 s of the model serving again", f"max {max(lag):.2f} s",
                          "yes" if max(lag) <= 1.0 else "no"))
    outside = sum(f["failed_outside"] for faults in per_model.values() for f in faults)
    longest = max(f["longest_answer_s"] for faults in per_model.values() for f in faults)
    targets.append(Target("failed only in flight at the kill or sent during the recovery; none waits 30 s",
                          f"{outside} outside; longest answer {longest} s", "yes" if outside == 0 and longest < 30 else "no"))
    tables = [Table("Each model killed in turn; medians over the faults",
                    ["model", "faults", "detection s", "detection max s", "serving again s", "reload s",
                     "ready again s", "failed (in flight at kill)", "failed outside", "longest answer s"], rows)]
    if rejuvenations:
        failed = sum(r["failed"] for r in rejuvenations)
        ratio = max(r["across_p99_ms"] / r["steady_p99_ms"] for r in rejuvenations)
        targets.append(Target(f"rejuvenation under load at {args.rejuvenate_clients} clients: 0 failed requests",
                              f"{failed} of {sum(r['requests'] for r in rejuvenations):,}", "yes" if failed == 0 else "no"))
        targets.append(Target("P99 across the swap at most 2x the steady state", f"{ratio:.2f}x (worst of "
                              f"{len(rejuvenations)})", "yes" if ratio <= 2.0 else "no"))
        tables.append(Table("Rejuvenation of sequence_torchscript", ["round", "requests", "failed", "swap s",
                                                                     "steady P99 ms", "across P99 ms", "ratio"],
                            [[str(i + 1), f"{r['requests']:,}", str(r["failed"]), str(r["swap_s"]),
                              str(r["steady_p99_ms"]), str(r["across_p99_ms"]),
                              f"{r['across_p99_ms'] / r['steady_p99_ms']:.2f}x"] for i, r in enumerate(rejuvenations)]))
    summarize_poison(p or {}, loop or {}, tables, targets)
    summarize_soak(soak or {}, tables, targets)
    first_model = next(iter(per_model))
    line = per_model[first_model][0]["timeline"]
    xs = [line["start_s"] + i * line["bin_s"] for i in range(len(line["answered"]))]
    peak = max(line["answered"]) or 1
    chart = Chart("faults-timeline", f"{first_model}: a kill -9 at 0 s and its recovery", "seconds from the kill",
                  f"answers per {int(line['bin_s'] * 1000)} ms",
                  [Series("answered", list(zip(xs, line["answered"]))), Series("failed", list(zip(xs, line["failed"]))),
                   Series("ready (readiness endpoint, scaled)", [(t, r * peak) for t, r in line["ready"]])],
                  x_line=0.0, x_line_label="kill -9")
    return dict(summary=(f"`latte serve` on the examples and a stock Python model ({STOCK}), {args.clients} clients "
                         f"on the model under test; each model's stub killed with SIGKILL {args.faults} times, the "
                         "models in turn. Readiness read every 20 ms from latte's health endpoint."),
                targets=targets, tables=tables, charts=[chart],
                notes=["A request in flight on the killed process is lost: its client gets "
                       "\"Stub process '<instance>' is not healthy\" (500); so do requests sent while the new copy "
                       "loads, since the dead copy keeps taking them until the swap."])


def build_repository(out: Path) -> Path:
    repo = out / "examples"
    if not (repo / "examples.json").exists():
        build_examples(repo)
    if not (repo / STOCK).exists():
        write_served_copy(repo, EXAMPLES["mlp"], repo / "mlp_onnx" / "1" / "model.onnx", STOCK, "python")
    if not (repo / LATTE_MODEL).exists():
        write_fault_models(repo)
    return repo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=10, help="kills of each model")
    parser.add_argument("--models", default=f"sequence_torchscript,mlp_onnx,{STOCK}")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rejuvenations", type=int, default=3)
    parser.add_argument("--rejuvenate-clients", type=int, default=16)
    parser.add_argument("--no-poison", action="store_true", help="leave out the poison and crash-loop parts")
    parser.add_argument("--poison-s", type=float, default=90.0, help="the poison part's length")
    parser.add_argument("--soak-requests", type=int, default=1_000_000,
                        help="the kill soak's requests to mlp_onnx (0: no soak)")
    parser.add_argument("--kill-every", type=float, default=60.0, help="the kill soak's seconds between kills")
    parser.add_argument("--restart-window", type=float, default=8.0,
                        help="the kills' server's restart window, shorter than the time between two kills of one model")
    parser.add_argument("--out", type=Path, default=Path(".latte/faults"))
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    repo = build_repository(args.out)
    load = wait_until_quiet(log=print)
    models = args.models.split(",")
    serve = Serve(repo, args.out, ["--restart-window", f"{args.restart_window:g}"])
    per_model = {m: [] for m in models}
    rejuvenations = []
    p = loop = soak = None
    try:
        for i in range(args.faults):
            for model in models:
                fault = one_fault(serve, model, args.clients)
                per_model[model].append(fault)
                print(f"fault {i + 1} {model}: detection {fault['detection_s']} s, serving again "
                      f"{fault['serving_again_s']} s, ready again {fault['ready_again_s']} s, failed {fault['failed']} "
                      f"({fault['failed_outside']} outside), of {fault['requests']}"
                      + (" (tritonserver aborted and was started again)" if fault["server_restarted"] else ""),
                      flush=True)
        for i in range(args.rejuvenations):
            r = rejuvenation(serve, "sequence_torchscript", args.rejuvenate_clients)
            rejuvenations.append(r)
            print(f"rejuvenation {i + 1}: {r}", flush=True)
        if not args.no_poison:
            p = poison(serve, args.clients // 2 or 1, args.poison_s)
            print(f"poison: {p}", flush=True)
        if args.soak_requests:
            soak = kill_soak(serve, "mlp_onnx", args.clients, args.soak_requests, args.kill_every)
            soak.update(model="mlp_onnx", every_s=args.kill_every)
            print(f"kill soak: {soak}", flush=True)
    finally:
        serve.stop()
    if not args.no_poison:
        looping = Serve(repo, args.out, name="crash-loop")
        try:
            loop = crash_loop(looping, args.clients)
            print(f"crash loop: {loop}", flush=True)
        finally:
            looping.stop()
    reloads = reload_seconds(serve.server_log)
    figures = dict(per_model=per_model, rejuvenations=rejuvenations, reloads=reloads, poison=p, crash_loop=loop,
                   kill_soak=soak)
    (args.out / "faults.json").write_text(json.dumps(figures, indent=1) + "\n")
    results = new_results("faults", "reliability", "Faults: kill -9 under load, and rejuvenation",
                          command_line("benchmarks/faults.py", sys.argv[1:]), load, ROOT)
    summary = summarize(per_model, rejuvenations, reloads, args, p, loop, soak)
    for t in summary["targets"]:
        print(f"  [{t.met}] {t.target}: {t.measured}")
    print(f"wrote {write_summary(results, summary, args.results_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
