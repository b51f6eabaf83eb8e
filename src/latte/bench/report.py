"""report.html: one self-contained page (PNG figures embedded as base64), summary first."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

from latte.bench import plots
from latte.bench.prometheus_scrape import series_key, split_key

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1060px;margin:2em auto;
     padding:0 1em;color:#1d1d1f;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#666;font-size:.9em}
table{border-collapse:collapse;margin:.8em 0;font-size:.92em}
th,td{padding:.35em .8em;border-bottom:1px solid #e3e3e3;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
thead th{background:#f5f5f7}
table.headline td{font-size:1.1em} table.headline td.v{font-weight:600}
.ok{color:#1a7f37} .bad{color:#cf222e}
figure{margin:1.2em 0} figure img{max-width:100%;border:1px solid #eee}
figcaption{color:#444;font-size:.9em;margin-top:.3em}
code{background:#f5f5f7;padding:0 .3em;border-radius:3px}
"""


def png_tag(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def figure(png: bytes, caption: str) -> str:
    return f"<figure>{png_tag(png, caption)}<figcaption>{caption}</figcaption></figure>"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], css: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""
    return f'<table class="{css}">{thead}<tbody>{body}</tbody></table>'


def page(title: str, meta: str, sections: List[str]) -> str:
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p class=\"meta\">{meta}</p>{''.join(sections)}</body></html>")


def _fmt(value, digits=2) -> str:
    return "–" if value is None else (f"{value:,.{digits}f}" if isinstance(value, float) else str(value))


def headline_rows(results: dict) -> List[Tuple[str, str]]:
    s = results["summary"]
    rows = [
        ("Peak throughput", f"{_fmt(s.get('peak_throughput'), 1)} inferences/s ({s.get('peak_at', '–')})"),
        ("P50 / P99 at light load", f"{_fmt(s.get('p50_ms_light_load'))} ms / {_fmt(s.get('p99_ms_light_load'))} ms"),
        ("P99 at peak throughput", f"{_fmt(s.get('p99_ms_at_peak'))} ms"),
        ("Mean batch size at peak", f"{_fmt(s.get('mean_batch_size_at_peak'))} (largest seen: "
                                    f"{s.get('largest_batch', '–')})"),
    ]
    if "server_rss_mb_start" in s:
        rows.append(("tritonserver RSS, start → end",
                     f"{s['server_rss_mb_start']:.1f} → {s['server_rss_mb_end']:.1f} MiB"))
        rows.append(("RSS of this model's stub(s), start → end",
                     f"{s['stubs_rss_mb_start']:.1f} → {s['stubs_rss_mb_end']:.1f} MiB"))
    failed = s.get("failed_points", 0)
    rows.append(("Load points measured", f'{s["points"] - failed} of {s["points"]}'
                 + (f' <span class="bad">({failed} failed, see below)</span>' if failed else ' <span class="ok">(all)</span>')))
    return rows


def latte_metric_rows(samples: List[dict], model: str) -> List[Tuple[str, Optional[float]]]:
    """(series, last value) for every latte_* series of `model`, keyed without the model label.

    The server's metrics carry every loaded model's series; the page is about one model.
    """
    series = {}
    for sample in samples:
        for key in sample["metrics"]:
            name, labels = split_key(key)
            if name.startswith("latte_") and labels.pop("model", None) == model:
                series[key] = series_key(name, labels)
    last = samples[-1]["metrics"] if samples else {}
    return sorted(((shown, last.get(key)) for key, shown in series.items()), key=lambda row: row[0])


def render_bench_report(results: dict) -> str:
    points = results["points"]
    lengths = results["lengths"]
    shape_note = (f"variable-shape inputs, lengths drawn from <code>{html.escape(lengths['distribution'])}</code> "
                  f"(1..{lengths['max_length']})" if lengths["variable"] else "fixed-shape inputs")
    meta = (f"model <code>{html.escape(results['model'])}</code> over {results['protocol'].upper()} · "
            f"{shape_note} · {results['started_at']} · {results['duration_s']} s · {html.escape(results['machine'])}")
    headline = table(("", ""), [(k, f'<span class="v">{v}</span>') for k, v in headline_rows(results)], "headline")
    detail_rows = []
    for p in points:
        level = f"{p['level']:g} concurrent" if p["kind"] == "concurrency" else f"{p['level']:g} req/s (Poisson)"
        relaxed = p.get("stability_percentage", 0) > results["settings"]["stability_percentage"]
        level += " †" if relaxed else ""
        if "error" in p:
            lines = p["error"].strip().splitlines()
            why = lines[0].split(" for model")[0] + (": " + lines[-1] if len(lines) > 1 else "")
            detail_rows.append((level, f'<span class="bad">{html.escape(why)}</span>',
                                "", "", "", "", "", ""))
            continue
        detail_rows.append((level, _fmt(p["throughput"], 1), _fmt(p["p50_ms"]), _fmt(p["p90_ms"]), _fmt(p["p99_ms"]),
                            _fmt(p["queue_us"] / 1000), _fmt(p["compute_us"] / 1000),
                            _fmt(p["server"]["mean_batch_size"])))
    details = table(("load", "infer/s", "P50 ms", "P90 ms", "P99 ms", "queue ms", "compute ms", "mean batch"),
                    detail_rows)
    ok = [p for p in points if "error" not in p]
    sections = ["<h2>Summary</h2>", headline, "<h2>Every load point</h2>", details]
    relaxed = sorted({p["stability_percentage"] for p in points
                      if p.get("stability_percentage", 0) > results["settings"]["stability_percentage"]})
    if relaxed:
        bound = " / ".join(f"{b:g} %" for b in relaxed)
        sections.append(f"<p class=\"meta\">† perf_analyzer could not settle within the stability asked for; the "
                        f"point was measured again with a {bound} bound (windows may differ several-fold), so "
                        f"treat it as noisy.</p>")
    if ok:
        sections += [
            "<h2>Latency against throughput</h2>",
            figure(plots.latency_throughput(points),
                   "P99 (solid) and P50 (dashed) latency against the throughput reached. A curve that stays flat "
                   "and then turns up shows where the server saturates; the Poisson sweep (red) shows what "
                   "bursty arrivals cost over evenly paced ones."),
            figure(plots.percentiles_vs_load(points),
                   "P50, P90 and P99 latency as load rises: left, a fixed number of requests in flight; right, "
                   "requests arriving at random (Poisson) at the given mean rate."),
            "<h2>Where the time goes</h2>",
            figure(plots.queue_compute_split(points),
                   "Server-side time per request as Triton reports it: queued (orange) and computing, input + infer + "
                   "output (green); the black bar is the average latency the client saw. A tall orange bar means "
                   "requests wait for the model; a gap above the green means client, network or protocol time."),
            "<h2>Batching</h2>",
            figure(plots.batch_sizes(points),
                   "Left: how many model executions ran at each batch size (from Triton's statistics API, deltas "
                   "over each load point). Right: mean batch size (rows executed / executions) per concurrency "
                   "level — how much dynamic batching gathers as more requests wait."),
        ]
    if results["samples"] and results["samples"][0]["rss"]:
        sections += ["<h2>Memory over time</h2>",
                     figure(plots.memory_over_time(results["samples"], points, results["model"]),
                            "Resident memory of tritonserver (black), of the Python backend stub serving this model "
                            "(colour) and of the other models' stubs (grey), read from /proc every "
                            f"{results['samples'][1]['t'] - results['samples'][0]['t']:.1f} s. Flat lines across "
                            "the sweep mean no growth under load." if len(results["samples"]) > 1 else
                            "Resident memory of tritonserver and its stubs.")]
    latte_rows = latte_metric_rows(results["samples"], results["model"])
    if latte_rows:
        sections += [f"<h2>Latte metrics of <code>{html.escape(results['model'])}</code> (last sample)</h2>",
                     table(("series", "value"), [(f"<code>{html.escape(k)}</code>", _fmt(v))
                                                 for k, v in latte_rows], "latte-metrics")]
    s = results["settings"]
    sections.append(f"<p class=\"meta\">perf_analyzer: measurement window {s['measurement_ms']} ms, up to "
                    f"{s['max_trials']} trials, stability {s['stability_percentage']:g} %, {s['samples']} distinct "
                    f"requests in --input-data. Full data: results.json beside this file.</p>")
    return page(f"Serving benchmark: {results['model']}", meta, sections)


def write_bench_report(results: dict, out_dir: Path) -> Path:
    path = Path(out_dir) / "report.html"
    path.write_text(render_bench_report(results))
    return path


def write_index(results_list: List[dict], out_dir: Path) -> Path:
    rows = []
    for r in results_list:
        s = r["summary"]
        rows.append((f'<a href="{html.escape(r["model"])}/report.html">{html.escape(r["model"])}</a>',
                     _fmt(s.get("peak_throughput"), 1), _fmt(s.get("p50_ms_light_load")),
                     _fmt(s.get("p99_ms_light_load")), _fmt(s.get("p99_ms_at_peak")),
                     _fmt(s.get("mean_batch_size_at_peak")),
                     f'{_fmt(s.get("server_rss_mb_start"), 0)} → {_fmt(s.get("server_rss_mb_end"), 0)}',
                     f'{_fmt(s.get("stubs_rss_mb_start"), 0)} → {_fmt(s.get("stubs_rss_mb_end"), 0)}',
                     s.get("failed_points", 0)))
    body = table(("model", "peak infer/s", "P50 ms light", "P99 ms light", "P99 ms at peak", "mean batch at peak",
                  "tritonserver MiB", "model stub MiB", "failed points"), rows)
    meta = html.escape(results_list[0]["machine"]) if results_list else ""
    path = Path(out_dir) / "index.html"
    path.write_text(page("Serving benchmarks", meta, ["<h2>Summary</h2>", body]))
    return path
