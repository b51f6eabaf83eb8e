"""`latte watch URL`: a running server's figures and the P95 forecast, refreshed in the terminal."""

from __future__ import annotations

import argparse
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("watch", help="watch a running server: throughput, latency, memory and the P95 forecast",
                       description="Scrape a running server's metrics (latte serve's --metrics-port, or a pod's "
                                   "port 8002) every few seconds and show, per model, throughput, P50/P95/P99, "
                                   "the queue, the arena, resident memory, errors and when P95 is projected to "
                                   "cross the SLO (linear or quadratic fit over the watch so far).")
    p.add_argument("url", help="the metrics endpoint, e.g. http://127.0.0.1:8002/metrics (or host:port)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between scrapes (default: %(default)s)")
    p.add_argument("--slo-ms", type=float, default=100.0, help="the P95 bound to forecast against (default: %(default)s)")
    p.add_argument("--count", type=int, default=0, help="stop after this many tables (default: run until Ctrl-C)")
    p.set_defaults(handler=_watch)


def _metrics_url(text: str) -> str:
    url = text if "://" in text else f"http://{text}"
    return url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"


def _table(rows, url: str, slo_ms: float):
    from rich.table import Table

    from latte.bench.watch import COLUMNS

    table = Table(title=f"{url}  (SLO {slo_ms:g} ms)", title_justify="left")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("model", "forecast") else "right")
    for row in rows:
        table.add_row(*(row[c] for c in COLUMNS))
    if not rows:
        table.caption = "waiting for the next scrape: figures are between two"
    return table


def _watch(args) -> int:
    from rich.console import Console
    from rich.live import Live

    from latte.bench.prometheus_scrape import scrape
    from latte.bench.watch import Watcher

    if args.interval <= 0 or args.slo_ms <= 0 or args.count < 0:
        raise ValueError("--interval and --slo-ms must be > 0, and --count >= 0")
    url = _metrics_url(args.url)
    watcher = Watcher(slo_ms=args.slo_ms)
    console = Console()
    shown = 0
    try:
        values = scrape(url)
    except OSError as exc:
        raise ValueError(f"cannot read {url}: {exc}") from None
    watcher.add(values)
    with Live(_table([], url, args.slo_ms), console=console, auto_refresh=False) as live:
        try:
            while not args.count or shown < args.count:
                time.sleep(args.interval)
                try:
                    rows = watcher.add(scrape(url))
                except OSError as exc:
                    console.print(f"scrape failed: {exc}")
                    continue
                live.update(_table(rows, url, args.slo_ms), refresh=True)
                shown += 1
        except KeyboardInterrupt:
            pass
    return 0
