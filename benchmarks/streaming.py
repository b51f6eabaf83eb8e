"""Streaming models batched continuously: latte's decoupled model against a stock Python-backend
decoupled model that runs the same programs a thread per request, in one tritonserver, over the
same gRPC streaming clients.

    .venv/bin/python benchmarks/streaming.py --rounds 3

For each example (the transformer, `gpt`, and the recurrent decoder, `gru`) and each number
of concurrent streams, interleaved rounds measure tokens/s, time to first token and
inter-token latency of latte, the stock model and the echo (a decoupled model that only sends
as many responses: their cost alone). The bound is H = 1 / (1/echo + 1/in-process), the
in-process rate being latte's own loop on the same streams in this process with nothing sent,
measured in each round beside that round's served windows (the server idle meanwhile), so that
each round's latte / H compares figures of the same minutes: the box's speed drifts between
minutes more than the code differs.
H counts the loop at what it costs alone; on a machine whose cores the server, the stub and the
clients share, it costs more beside them. So each round also runs the loop while clients in
another process stream from the echo, and counts its tokens per second of its own CPU time:
H beside the echo = 1 / (1/echo + 1/that rate).
Every request asks for --max-tokens outputs (ignore_eos), so both contenders stream alike.
Time to first token is counted over every round's first tokens together (a window of a few
seconds holds a few hundred, or fewer, so one window's own P99 is one of its largest few);
tokens/s and inter-token latency are medians of the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent

from latte.bench import cpu  # noqa: E402
from latte.bench.quiet import wait_until_quiet  # noqa: E402
from latte.bench.results import (Chart, Series, Table, Target, command_line, new_results, paired_ratios,  # noqa: E402
                                 ratio_against, record_run)
from latte.bench.streams import (harmonic_bound, in_process_beside_echo, in_process_model,  # noqa: E402
                                 in_process_tokens_per_s, measure_streams, pooled_ms)

PROMPTS = [b"Once upon a time", b"The quick brown fox jumps", b"hello", b"Streams join and leave between steps",
           b"a b c d e f g", b"Triton serves models", b"what comes next?", b"0123456789"]


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def measure(url: str, model: str, concurrency: int, seconds: float, max_tokens: int,
            server_pid: Optional[int] = None, **sampling) -> Dict:
    """The window's figures; a contender's own first-token times too, for its TTFT over the
    rounds (the echo's are not compared). With the server's pid, the CPU of the server, the
    model's stubs and this process (the clients) over the window too."""
    reader = None
    if server_pid is not None:
        stubs = cpu.model_stub_pids(server_pid, model)

        def reader():
            sample = cpu.sample(server_pid, stubs)  # its client is a child's; the clients here are this process
            return {"server": sample.server, "stub": sample.stubs, "client": cpu.process_cpu_seconds(os.getpid())}
    return measure_streams(url, model, concurrency, seconds, max_tokens, PROMPTS, cpu=reader,
                           **sampling).as_dict(samples=model != "echo")


def at_cadence(kind: str) -> str:
    """The served key of the echo sent at latte's cadence for `kind`: a response every gap a
    stream, the gap being latte's inter-token P50 in the same round and level."""
    return f"echo_at_{kind}"


def run(args) -> Dict:
    from latte.examples.streams import write_echo_model, write_stock_model, write_stream_model

    kinds = args.models.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    repo = Path(tempfile.mkdtemp(prefix="latte-streaming-")) / "repository"
    repo.mkdir(parents=True)
    for kind in kinds:
        write_stream_model(repo, f"latte_{kind}", kind, max_streams=max(levels), max_tokens=args.max_tokens)
        write_stock_model(repo, f"stock_{kind}", kind, max_tokens=args.max_tokens)
    write_echo_model(repo, "echo")
    load = wait_until_quiet(log=lambda line: print(f"  {line}", flush=True))
    print(f"load average at start: {load:.2f}", flush=True)
    bound: Dict[str, Dict[int, List[float]]] = {kind: {c: [] for c in levels} for kind in kinds}
    beside: Dict[str, Dict[int, List[float]]] = {kind: {c: [] for c in levels if c > 1} for kind in kinds}
    models = {}
    try:
        for kind in kinds:
            models[kind] = in_process_model(repo / f"latte_{kind}")
        served = _serve(args, repo, kinds, levels, models, bound, beside)
    finally:
        for model in models.values():
            model.finalize()
    return {"load_average_at_start": load, "levels": levels, "kinds": kinds, "max_tokens": args.max_tokens,
            "seconds": args.seconds, "in_process": bound, "in_process_by_round": True, "beside_echo": beside,
            "served": served}


def _serve(args, repo: Path, kinds: List[str], levels: List[int], models: Dict, bound: Dict, beside: Dict) -> Dict:
    """The interleaved rounds in one server; each round and level also runs every in-process
    loop alone, the server idle (into `bound`), and beside the echo's clients (into `beside`)."""
    from latte.triton import TritonServer

    served: Dict[str, Dict[int, List[Dict]]] = {}
    contenders = [f"{side}_{kind}" for kind in kinds for side in ("latte", "stock")] + ["echo"]
    with TritonServer(repo, log_path=repo.parent / "tritonserver.log") as server:
        for name in contenders:
            measure(server.grpc_url, name, 4, 1.0, args.max_tokens)  # warm
        for r in range(args.rounds):
            order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
            for c in levels:
                for kind in kinds:
                    rate = in_process_tokens_per_s(models[kind], PROMPTS, c, args.max_tokens, args.in_process_s)
                    bound[kind][c].append(rate)
                    print(f"round {r + 1}, {c:>3} streams, in process, {kind}: {rate:8.0f} tokens/s", flush=True)
                for kind in (kinds if c > 1 else []):
                    rate = in_process_beside_echo(models[kind], server.grpc_url, "echo", PROMPTS, c, args.max_tokens,
                                                  args.in_process_s)
                    beside[kind][c].append(rate)
                    print(f"round {r + 1}, {c:>3} streams, in process beside the echo, {kind}: {rate:8.0f} tokens "
                          "per second of the loop's CPU time", flush=True)
                for name in order:
                    figures = measure(server.grpc_url, name, c, args.seconds, args.max_tokens, server.process.pid)
                    served.setdefault(name, {}).setdefault(c, []).append(figures)
                    _print_window(r, c, name, figures)
                # The echo again, each stream's responses one every latte's inter-token P50 of
                # this round: what the responses cost at the cadence of a stream in a batched
                # loop, against the echo's back-to-back ones.
                for kind in (kinds if c > 1 else []):
                    gap = served[f"latte_{kind}"][c][-1]["itl_p50_ms"]
                    if gap is None:  # latte's window had no gaps to pace by
                        continue
                    figures = measure(server.grpc_url, "echo", c, args.seconds, args.max_tokens, server.process.pid,
                                      gap_ms=gap)
                    served.setdefault(at_cadence(kind), {}).setdefault(c, []).append({**figures, "gap_ms": gap})
                    _print_window(r, c, at_cadence(kind), figures)
    return served


def _print_window(r: int, c: int, name: str, figures: Dict) -> None:
    busy, processes = figures.get("busy_cores"), figures.get("process_cores") or {}
    print(f"round {r + 1}, {c:>3} streams, {name:<12} {figures['tokens_per_s']:8.0f} tokens/s  "
          f"TTFT P50 {figures['ttft_p50_ms'] or 0:6.1f} ms P99 {figures['ttft_p99_ms'] or 0:6.1f} ms"
          f"  ITL P50 {figures['itl_p50_ms'] or 0:5.2f} ms  errors {figures['errors']}"
          + (f"  cores busy {busy:.2f}" if busy is not None else "")
          + "".join(f" {name} {cores:.2f}" for name, cores in processes.items()), flush=True)


def _med(runs: List[Dict], key: str):
    return _median([run[key] for run in runs])


def _first_tokens(runs: List[Dict]) -> int:
    return sum(len(run["ttft_ms"]) for run in runs)


def _ms(value, decimals: Optional[int] = None) -> str:
    """Milliseconds as the table shows them: `decimals`, or by default two under 10 ms and one
    above; "-" for none."""
    if value is None:
        return "-"
    if decimals is None:
        decimals = 2 if value < 10 else 1
    return f"{value:.{decimals}f}"


def _ratio(ours, theirs):
    return ours / theirs if ours is not None and theirs else None


def _cores(run: Dict, part: str) -> Optional[float]:
    """Cores busy over a window: the machine's, the server's and the clients' together, or the
    model's stubs'."""
    if part == "machine":
        return run.get("busy_cores")
    processes = run.get("process_cores") or {}
    names = ("server", "client") if part == "server and client" else (part,)
    return sum(processes[name] for name in names) if all(name in processes for name in names) else None


def _cpu_us(runs: List[Dict], part: str = "machine") -> Optional[float]:
    """µs of CPU time per token or response of `part` (_cores): the median over the windows
    that read it."""
    return _median([1e6 * _cores(run, part) / run["tokens_per_s"] for run in runs
                    if _cores(run, part) is not None and run["tokens_per_s"]])


CPU_PARTS = ("machine", "server and client", "stub")


def _cpu_row(kind: str, c: int, latte: List[Dict], echo: List[Dict], paced: List[Dict]):
    """The CPU table's row and {contender: {part: µs}} with the gap; (None, None) where the run
    did not read every part."""
    contenders = {"latte": latte, "echo": echo, "paced": paced}
    figures = {name: {part: _cpu_us(runs, part) for part in CPU_PARTS} for name, runs in contenders.items()}
    gap = _median([run.get("gap_ms") for run in paced])
    if gap is None or any(us is None for parts in figures.values() for us in parts.values()):
        return None, None

    def cells(name):
        parts, runs = figures[name], contenders[name]
        return [f"{parts['machine']:.0f} ({_median([_cores(run, 'machine') for run in runs]):.2f})",
                f"{parts['server and client']:.0f} / {parts['stub']:.0f}"]

    row = [kind, str(c), *cells("latte"), *cells("echo"), f"{gap:.2f}", *cells("paced"),
           f"{_med(paced, 'tokens_per_s'):.0f}"]
    return row, {**figures, "gap": gap}


def _share(latte: List[Dict], echo: List[Dict], loop: List[float], by_round: bool) -> Optional[float]:
    """latte / H: where the loop was measured in each round, the median of the rounds' own
    ratios, each against its round's H (its echo window and its loop's rate); else, or without
    a round that has all three, latte's median over H of the medians."""
    if by_round:
        shares = []
        for ours, theirs, rate in zip(latte, echo, loop):
            bound = harmonic_bound(theirs["tokens_per_s"] or 0.0, rate or 0.0)
            if bound > 0 and ours["tokens_per_s"] is not None:
                shares.append(ours["tokens_per_s"] / bound)
        if shares:
            return statistics.median(shares)
    ours, bound = _med(latte, "tokens_per_s"), harmonic_bound(_med(echo, "tokens_per_s") or 0.0, _median(loop) or 0.0)
    return ours / bound if bound and ours is not None else None


def summarize(result: Dict) -> Dict:
    levels, kinds, served = result["levels"], result["kinds"], result["served"]
    rows, cpu_rows, targets, charts = [], [], [], []
    ratio_at: Dict = {}
    cpu_at: Dict = {}      # (kind, level): µs a token or response (latte, echo, echo at latte's cadence), gap
    beside_at: Dict = {}   # (kind, level): (the loop's cost beside the echo / alone, latte / H beside)
    # Runs that measure the loop in each round give each round's latte / H its own bound; earlier
    # runs measured it once before the server started, so only the medians can be compared.
    by_round = bool(result.get("in_process_by_round"))
    for kind in kinds:
        latte, stock = served[f"latte_{kind}"], served[f"stock_{kind}"]
        points = {"latte": [], "stock": [], "bound H": []}
        for c in levels:
            ratios = paired_ratios(latte[c], stock[c], "tokens_per_s")
            echo = _med(served["echo"][c], "tokens_per_s")
            loops, loops_beside = result["in_process"][kind][c], result.get("beside_echo", {}).get(kind, {}).get(c, [])
            inproc = _median(loops)
            h = harmonic_bound(echo, inproc)
            ours = _med(latte[c], "tokens_per_s")
            loop_beside = _median(loops_beside)
            h_beside = harmonic_bound(echo, loop_beside) if loop_beside else None
            share = _share(latte[c], served["echo"][c], loops, by_round)
            share_beside = _share(latte[c], served["echo"][c], loops_beside, by_round) if h_beside else None
            ratio_at[(kind, c)] = (_median(ratios), share, ours, h)
            beside_at[(kind, c)] = (inproc / loop_beside, share_beside) if h_beside else None
            ttft = (pooled_ms(latte[c], 99), pooled_ms(stock[c], 99))
            rows.append([kind, str(c), f"{ours:.0f}", f"{_med(stock[c], 'tokens_per_s'):.0f}",
                         f"{_median(ratios):.2f}x", f"{echo:.0f}", f"{inproc:.0f}", f"{h:.0f}",
                         f"{100 * share:.0f} %" if share is not None else "-",
                         f"{loop_beside:.0f}" if loop_beside else "-",
                         f"{h_beside:.0f} ({100 * share_beside:.0f} %)" if h_beside else "-",
                         f"{_ms(pooled_ms(latte[c], 50))} / {_ms(ttft[0])}",
                         f"{_ms(pooled_ms(stock[c], 50))} / {_ms(ttft[1])}",
                         f"{_ms(_med(latte[c], 'itl_p50_ms'), 2)} / {_ms(_med(latte[c], 'itl_p99_ms'), 2)}",
                         f"{_ms(_med(stock[c], 'itl_p50_ms'), 2)} / {_ms(_med(stock[c], 'itl_p99_ms'), 2)}",
                         f"{_med(latte[c], 'in_flight'):.1f}"])
            if served.get(at_cadence(kind), {}).get(c):
                row, cpu_at[(kind, c)] = _cpu_row(kind, c, latte[c], served["echo"][c], served[at_cadence(kind)][c])
                if row is not None:
                    cpu_rows.append(row)
            points["latte"].append((c, ours))
            points["stock"].append((c, _med(stock[c], "tokens_per_s")))
            points["bound H"].append((c, h))
        charts.append(Chart(f"streaming-{kind}", f"Tokens/s against concurrent streams ({kind})", "concurrent streams",
                            "tokens/s", [Series(label, pts) for label, pts in points.items()], log_x=True))
    if "gpt" in kinds and 16 in levels:
        ratio, share, ours16, bound16 = ratio_at[("gpt", 16)]
        stock16 = _med(served["stock_gpt"][16], "tokens_per_s")
        why = ""
        if ratio < 4 and bound16 and stock16:
            why = f"the bound H at 16 streams allows {bound16:.0f} tokens/s, {bound16 / stock16:.2f}x the stock model's"
        targets.append(Target("Tokens/s at 16 streams >= 4x the stock decoupled model (transformer)",
                              f"{ratio:.2f}x", "yes" if ratio >= 4 else "no", why))
        if 64 in levels:
            _, share64, ours64, bound64 = ratio_at[("gpt", 64)]
            # Each round's own 64 / 16, as latte / stock and latte / H are judged: the box drifts
            # between rounds more than between a round's two levels.
            growth = paired_ratios(served["latte_gpt"][64], served["latte_gpt"][16], "tokens_per_s")
            grew = _median(growth) > 1 if growth else ours64 > ours16
            measured = f"{ours64:.0f} vs {ours16:.0f}"
            if growth:
                measured = (f"{_median(growth):.2f}x (the median of the rounds' own ratios, rounds "
                            f"{min(growth):.2f}-{max(growth):.2f}; the medians {ours64:.0f} vs {ours16:.0f})")
            why = ""
            if not grew and bound16 and bound64 and share and share64:
                echo16, echo64 = (_med(served["echo"][c], "tokens_per_s") for c in (16, 64))
                why = (f"the bound H grows {bound64 / bound16:.2f}x from 16 to 64 streams ({bound16:.0f} to "
                       f"{bound64:.0f} tokens/s; the echo alone {echo16:.0f} and {echo64:.0f})"
                       + (": the serving cost bounds both levels" if bound64 < 1.1 * bound16 else "")
                       + f", and latte reaches {100 * share:.0f} % and {100 * share64:.0f} % of it")
            targets.append(Target("Tokens/s at 64 streams above 16 (transformer)", measured, "yes" if grew else "no",
                                  why))
        ours, theirs = served["latte_gpt"][16], served["stock_gpt"][16]
        ttft = _ratio(pooled_ms(ours, 99), pooled_ms(theirs, 99))
        rounds = _median(paired_ratios(ours, theirs, "ttft_p99_ms"))
        targets.append(Target("TTFT P99 at 16 streams <= 0.5x the stock model's (transformer)",
                              f"{ratio_against(ttft, 0.5)} (the rounds' first tokens together: "
                              f"{_first_tokens(ours):,} and {_first_tokens(theirs):,}; median of the rounds' own "
                              f"P99 ratios {ratio_against(rounds, 0.5)})",
                              "yes" if ttft is not None and ttft <= 0.5 else "no"))
    above_one = [c for c in levels if c > 1]
    for kind in kinds:
        if above_one:
            level = min(above_one, key=lambda c: ratio_at[(kind, c)][1])
            worst, reasons = ratio_at[(kind, level)][1], []
            if worst < 0.8 and beside_at.get((kind, level)):
                cost, share = beside_at[(kind, level)]
                reasons.append(f"at {level} streams the loop costs {cost:.2f}x its CPU time per token beside the "
                               f"echo's traffic; against H beside the echo latte reaches {100 * share:.0f} %")
            if worst < 0.8 and cpu_at.get((kind, level)):
                figures = cpu_at[(kind, level)]
                server_client = {name: figures[name]["server and client"] for name in ("latte", "echo", "paced")}
                reasons.append(f"the server and the clients spend {server_client['echo']:.0f} µs of CPU a response "
                               f"on the echo back to back, {server_client['paced']:.0f} µs sent as latte sends a "
                               f"stream's outputs (one every {figures['gap']:.2f} ms), and "
                               f"{server_client['latte']:.0f} µs on latte's tokens")
            why = "; ".join(reasons)
            _, _, rate, bound = ratio_at[(kind, level)]
            measured = f"{100 * worst:.0f} % at worst"
            if by_round and bound:
                measured += (f" ({level} streams, the median of the rounds' own ratios; the medians' ratio "
                             f"{100 * rate / bound:.0f} %)")
            targets.append(Target(f"At least 80 % of the bound H ({kind}, every level above one stream)",
                                  measured, "yes" if worst >= 0.8 else "no", why))
    if 1 in levels and "gpt" in kinds:
        one = [_ratio(pooled_ms(served["latte_gpt"][1], 50), pooled_ms(served["stock_gpt"][1], 50)),
               _ratio(_med(served["latte_gpt"][1], "itl_p50_ms"), _med(served["stock_gpt"][1], "itl_p50_ms"))]
        within = all(r is not None and r <= 1.1 for r in one)
        targets.append(Target("One stream: TTFT and inter-token P50 within 10 % of the stock model's (transformer)",
                              f"TTFT {ratio_against(one[0], 1.1)}, inter-token {ratio_against(one[1], 1.1)}",
                              "yes" if within else "no"))
    table = Table("Per example and concurrent streams (medians of the rounds; TTFT over the rounds' first tokens "
                  "together); TTFT and inter-token latency (ITL) in ms, P50 / P99",
                  ["example", "streams", "latte tokens/s", "stock tokens/s", "latte / stock", "echo tokens/s",
                   "in-process tokens/s", "bound H", "latte / H", "loop beside the echo (tokens per CPU s)",
                   "H beside the echo (latte's share)", "latte TTFT", "stock TTFT", "latte ITL", "stock ITL",
                   "latte in flight"], rows)
    tables = [table]
    if cpu_rows:
        tables.append(Table("CPU time per token or response, in µs: of the whole machine (with its cores busy on "
                            "average, of all of them), and of the server and the clients together / of the model's "
                            "stub; the echo back to back, and at latte's cadence: each stream's responses one every "
                            "gap, latte's inter-token P50 in that round",
                            ["example", "streams", "latte: machine (cores busy)", "latte: server and clients / stub",
                             "echo: machine (cores busy)", "echo: server and clients / stub", "gap ms",
                             "echo at the gap: machine (cores busy)", "echo at the gap: server and clients / stub",
                             "echo at the gap, tokens/s"], cpu_rows))
    best = max(ratio_at.items(), key=lambda item: item[1][0])
    summary = (f"latte streams {best[1][0]:.2f}x the stock decoupled model's tokens/s at best ({best[0][0]}, "
               f"{best[0][1]} streams); every output is one response through the stub, whose cost (the echo) "
               "bounds both.")
    windows = [len(w["ttft_ms"]) for name, by_level in served.items() if not name.startswith("echo")
               for runs in by_level.values() for w in runs]
    fewest, most = (min(windows), max(windows)) if windows else (0, 0)
    notes = [f"Each request asks for {result['max_tokens']} outputs (ignore_eos); each measurement runs "
             f"{result['seconds']:g} s after a 1 s warm-up, over gRPC streams (tritonclient's asyncio client), "
             "one stream per client, the next request sent when the last one's final response is in.",
             "Time to first token is counted over every round's first tokens together: a window held "
             f"{fewest:,} to {most:,} of them, so one window's own P99 is one of its largest few. "
             "Tokens/s and inter-token latency (thousands of gaps a window) are medians of the rounds.",
             "The in-process rate is latte's own iteration loop on the same programs and streams in this process, "
             "nothing sent; the echo is a stock decoupled model that only sends as many responses.",
             *(["Each round measures the loop alone (the server idle) beside its served windows, and latte / H is "
                "the median of the rounds' own ratios, each against its round's H: the box's speed drifts from one "
                "minute to the next, and a bound measured minutes apart from latte moves the ratio with it. The "
                "table's echo, in-process and H columns are medians of the rounds."] if by_round else []),
             "Beside the echo: the same loop while clients in another process stream from the echo at the same "
             "level, counted per second of the loop's own CPU time (what a token costs it with the server, the "
             "stub and the clients on the same cores); H beside the echo puts that rate in H's place."]
    return {"summary": summary, "targets": targets, "tables": tables, "charts": charts, "notes": notes}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt,gru", help="examples to run (default: %(default)s)")
    parser.add_argument("--concurrency", default="1,16,64", help="concurrent streams (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=6.0, help="each measurement (default: %(default)s)")
    parser.add_argument("--in-process-s", type=float, default=3.0, help="each in-process measurement")
    parser.add_argument("--max-tokens", type=int, default=64, help="outputs per request (default: %(default)s)")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    started = new_results("streaming", "streaming", "Streaming: continuous batching against a stock decoupled model",
                          command_line("benchmarks/streaming.py", argv), None, HERE.parent)
    print(f"wrote {record_run(started, lambda: run(args), summarize, args.results_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
