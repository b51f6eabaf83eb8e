"""report.html: self-contained, summary first, one captioned PNG per figure, drawn as such by a browser."""

import base64
import io
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from latte.bench.report import latte_metric_rows, render_bench_report
from latte.bench.runner import summarize
from latte.bench.prometheus_scrape import Sample


def _point(kind, level, throughput, p99, batches):
    return {"kind": kind, "level": level, "t_start": level, "t_end": level + 1, "throughput": throughput,
            "p50_ms": p99 / 3, "p90_ms": p99 / 1.5, "p95_ms": p99 / 1.2, "p99_ms": p99, "avg_ms": p99 / 2.5,
            "queue_us": 100.0 * level, "compute_us": 800.0,
            "server": {"mean_batch_size": sum(int(k) * v for k, v in batches.items()) / sum(batches.values()),
                       "batch_size_counts": batches}}


def _results():
    points = [_point("concurrency", 1, 400.0, 3.0, {"1": 800}), _point("concurrency", 4, 1100.0, 6.5, {"2": 300, "4": 400}),
              _point("request_rate", 275, 274.0, 3.4, {"1": 500, "2": 20}),
              {"kind": "request_rate", "level": 1100, "t_start": 9, "t_end": 10, "error": "perf_analyzer failed (exit 1)",
               "server": {"mean_batch_size": 0, "batch_size_counts": {}}}]
    # The server's metrics hold every loaded model's series, Triton's and Latte's.
    metrics = {'latte_arena_bytes{model="mlp_onnx",state="reserved"}': 1024.0,
               'latte_arena_bytes{model="identity",state="reserved"}': 2048.0,
               'latte_batch_size_count{model="identity"}': 7.0,
               'nv_inference_count{model="mlp_onnx",version="1"}': 800.0}
    samples = [Sample(t, metrics, {"tritonserver": (300 + t) * 2**20, "stub:41:mlp_onnx_0_0": 500 * 2**20})
               for t in (0.0, 0.5, 1.0, 1.5)]
    return {"model": "mlp_onnx", "protocol": "grpc", "started_at": "2026-11-21 10:00:00", "duration_s": 12.0,
            "machine": "Linux x86_64, 2 cores", "lengths": {"distribution": "lognormal:median=24", "variable": True,
                                                            "max_length": 128},
            "settings": {"measurement_ms": 1500, "max_trials": 4, "stability_percentage": 50, "samples": 256},
            "points": points, "summary": summarize(points, samples), "samples": [s.as_dict() for s in samples]}


def test_summary_picks_the_peak_and_the_light_load_point():
    summary = _results()["summary"]
    assert summary["peak_throughput"] == 1100.0 and summary["peak_at"] == "concurrency 4"
    assert summary["p99_ms_light_load"] == 3.4          # the Poisson point at 274/s was the lightest
    assert summary["failed_points"] == 1 and summary["largest_batch"] == 4
    assert summary["server_rss_mb_start"] == 300.0 and summary["server_rss_mb_end"] == 301.5


def test_the_report_is_self_contained_with_the_summary_before_the_figures():
    html = render_bench_report(_results())
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert html.index("Peak throughput") < html.index("<img")
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(images) == 5  # latency-throughput, percentiles, queue/compute split, batch sizes, memory
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert html.count("<figcaption>") == len(images)
    assert "perf_analyzer failed (exit 1)" in html and "1 failed" in html


def test_the_latte_metrics_table_shows_the_benchmarked_models_series_only():
    results = _results()
    assert latte_metric_rows(results["samples"], "mlp_onnx") == [('latte_arena_bytes{state="reserved"}', 1024.0)]
    html = render_bench_report(results)
    assert "Latte metrics of <code>mlp_onnx</code>" in html
    assert "<code>latte_arena_bytes{state=&quot;reserved&quot;}</code></td><td>1,024.00</td>" in html
    assert "identity" not in html and "2,048" not in html


# --- The page in a real browser: headless Chromium, offline, on the file itself. ---

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (1200, 10000)       # tall enough for the whole page: the screenshot is of the window only
PAGE_WIDTH = 1060            # the report's body max-width, which scales wider figures down


@pytest.fixture
def chromium(tmp_path):
    """Run headless Chromium on a local page; the test is skipped where no Chromium is installed."""
    binary = next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)
    if binary is None:
        pytest.skip("no chromium on PATH to render report.html in (on Debian: apt-get install -y chromium)")

    def run(page: Path, *args: str) -> str:
        # --no-sandbox: Chromium refuses to start as root otherwise (containers, CI). The other
        # switches keep it from reaching for the network or a desktop session.
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                   "--disable-background-networking", "--disable-component-update", "--disable-sync",
                   "--force-device-scale-factor=1", "--hide-scrollbars",
                   f"--user-data-dir={tmp_path / 'chromium-profile'}", *args, page.as_uri()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    return run


class PageParts(HTMLParser):
    """The headings, figures and Latte metrics series of a page, read from the browser's DOM."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.headings, self.figures, self.metric_series = [], [], []
        self._text = None            # the list that collects the text being read, if any
        self._caption = [""]
        self._in_metrics = False
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "h2":
            self.headings.append("")
            self._text = self.headings
        elif tag == "figure":
            self.figures.append({"src": None, "caption": ""})
        elif tag == "img" and self.figures:
            self.figures[-1]["src"] = attrs.get("src")
        elif tag == "figcaption":
            self._caption = [""]
            self._text = self._caption
        elif tag == "table":
            self._in_metrics = "latte-metrics" in (attrs.get("class") or "")
        elif tag == "code" and self._in_metrics:
            self.metric_series.append("")
            self._text = self.metric_series

    def handle_endtag(self, tag):
        if tag == "figcaption":
            self.figures[-1]["caption"] = self._caption[0]
        if tag in ("h2", "figcaption") or (tag == "code" and self._in_metrics):
            self._text = None
        if tag == "table":
            self._in_metrics = False

    def handle_data(self, data):
        if self._text is not None:
            self._text[-1] += data


class Screenshot:
    """What a PNG screenshot shows: its size, where the content ends and how much of it is coloured."""

    def __init__(self, path: Path) -> None:
        pixels = np.asarray(Image.open(path).convert("RGB")).astype(int)
        self.size = (pixels.shape[1], pixels.shape[0])
        inked_rows = np.flatnonzero((pixels < 245).any(axis=2).any(axis=1))
        self.bottom = int(inked_rows.max()) if inked_rows.size else 0
        # Text is black or grey; the figures' lines and bars are what is coloured.
        self.coloured = int(((pixels.max(axis=2) - pixels.min(axis=2)) > 60).sum())


def shown_height(png: bytes) -> float:
    """The height a figure takes on the page: its own size, scaled down to the page width if wider."""
    width, height = Image.open(io.BytesIO(png)).size
    return height * min(width, PAGE_WIDTH) / width


def screenshot(chromium, page: Path) -> Screenshot:
    shot = page.with_suffix(".png")
    chromium(page, f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={shot}")
    assert shot.stat().st_size > 10_000
    return Screenshot(shot)


def test_a_browser_shows_every_section_figure_and_only_this_models_metrics(chromium, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_bench_report(_results()))
    parts = PageParts(chromium(page, "--dump-dom"))
    assert parts.headings == ["Summary", "Every load point", "Latency against throughput", "Where the time goes",
                              "Batching", "Memory over time", "Latte metrics of mlp_onnx (last sample)"]
    assert len(parts.figures) == 5
    for figure in parts.figures:
        assert figure["src"].startswith("data:image/png;base64,")
        assert len(figure["caption"]) > 40
    assert parts.metric_series == ['latte_arena_bytes{state="reserved"}']


def test_a_browser_draws_every_figure_at_its_size(chromium, tmp_path):
    html = render_bench_report(_results())
    figures = [base64.b64decode(i) for i in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]
    page, text_only = tmp_path / "report.html", tmp_path / "text_only.html"
    page.write_text(html)
    # The same page without its images: how tall the text alone is.
    text_only.write_text(re.sub(r"<img [^>]*>", "", html))
    drawn, text = screenshot(chromium, page), screenshot(chromium, text_only)
    assert drawn.size == WINDOW
    assert drawn.bottom < WINDOW[1] - 100, "the page is taller than the window: raise WINDOW"
    # A figure the browser cannot decode shows as a small broken-image box, so the page grows
    # by less than the figures' heights; the slack (borders, line gaps) is well under one figure.
    heights = [shown_height(png) for png in figures]
    assert abs((drawn.bottom - text.bottom) - sum(heights)) < min(heights) / 2
    assert drawn.coloured > 20 * max(text.coloured, 100)
