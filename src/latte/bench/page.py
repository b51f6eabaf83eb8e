"""docs/benchmarks.md, rendered from benchmarks/results/*.json with its charts.

    .venv/bin/python -m latte.bench.page

The page holds today's figures only: a summary of every target, then one section per area,
each benchmark's tables with the command, machine, load and revision that produced them, its
charts, and what is not met and why. A test renders it again and compares (a figure typed
into the page by hand fails it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from latte.bench.quiet import QUIET_LOAD
from latte.bench.results import AREAS, Chart, Results, ResultsError, Table, by_area, read_all

IMAGES = "img/benchmarks"       # relative to the page
HEADER = """# Benchmarks

Today's figures, rendered from `benchmarks/results/*.json` by
`.venv/bin/python -m latte.bench.page`; do not edit this page by hand. Each benchmark run
rewrites its results file, and git keeps the earlier runs. Every figure names the command
that reproduces it, the machine, the 1-minute load average when it started, the date (UTC) and
the revision it ran on.
"""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(table: Table) -> List[str]:
    lines = [f"| {' | '.join(_cell(c) for c in table.columns)} |", "|" + "---|" * len(table.columns)]
    lines += [f"| {' | '.join(_cell(c) for c in row)} |" for row in table.rows]
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading."""
    kept = "".join(ch for ch in heading.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def summary_table(results: Sequence[Results]) -> Table:
    rows = []
    headings = dict(AREAS)
    for r in results:
        link = f"[{headings[r.area].split(':')[0]}](#{anchor(r.title)})"
        for t in r.targets:
            rows.append([link, t.target, t.measured, t.met + (f": {t.why}" if t.why and t.met != "yes" else "")])
    return Table("", ["area", "target", "measured", "met"], rows)


def glance_table(results: Sequence[Results]) -> Table:
    """Per area, how many of its targets are met: the page in a few lines."""
    counts: Dict[str, Dict[str, int]] = {}
    for r in results:
        tally = counts.setdefault(r.area, {"yes": 0, "partly": 0, "no": 0})
        for t in r.targets:
            tally[t.met] += 1
    rows = []
    for area, heading in AREAS:
        if area in counts:
            tally = counts[area]
            total = sum(tally.values())
            rows.append([f"[{heading.split(':')[0]}](#{anchor(heading)})", f"{tally['yes']} of {total}",
                         str(tally["partly"]), str(tally["no"])])
    return Table("", ["area", "targets met", "partly", "not met"], rows)


def chart_file(chart: Chart) -> str:
    return f"{IMAGES}/{chart.name}.svg"


def section(r: Results) -> List[str]:
    load = "not recorded as one figure" if r.load_at_start is None else f"{r.load_at_start:.2f}"
    quiet = "" if r.load_at_start is None or r.load_at_start < QUIET_LOAD else f" (above {QUIET_LOAD}: not a quiet machine)"
    lines = [f"### {r.title}", "",
             f"Measured {r.date} UTC on {r.machine}; load average at the start {load}{quiet}; revision "
             f"{r.revision}.", "",
             f"    {r.command}", ""]
    if r.summary:
        lines += [r.summary, ""]
    # The first table is the run's headline; the rest (per level, per round, CPU) fold away.
    for index, table in enumerate(r.tables):
        if index == 1:
            rest = len(r.tables) - 1
            lines += ["<details>", f"<summary>{rest} more table{'s' if rest > 1 else ''}</summary>", ""]
        if table.caption:
            lines += [table.caption, ""]
        lines += markdown_table(table) + [""]
    if len(r.tables) > 1:
        lines += ["</details>", ""]
    for chart in r.charts:
        lines += [f"![{chart.title}]({chart_file(chart)})", ""]
    lines += [f"- {note}" for note in r.notes] + ([""] if r.notes else [])
    missed = [t for t in r.targets if t.met != "yes"]
    if missed:
        lines += ["Not met:", ""] + [f"- {t.target}: {t.met}, {t.measured}" + (f". Why: {t.why}." if t.why else ".")
                                     for t in missed] + [""]
    elif r.targets:
        lines += ["Every target of this run is met.", ""]
    return lines


def render_markdown(results: Sequence[Results]) -> str:
    lines = [HEADER, "## At a glance", ""] + markdown_table(glance_table(results)) + [""]
    lines += ["## Summary", ""] + markdown_table(summary_table(results)) + [""]
    grouped = by_area(results)
    for area, heading in AREAS:
        if area not in grouped:
            continue
        lines += [f"## {heading}", ""]
        for r in grouped[area]:
            lines += section(r)
    return "\n".join(lines).rstrip("\n") + "\n"


def draw(chart: Chart) -> bytes:
    """The chart as SVG, the same bytes for the same data (no date, a fixed id salt)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "latte", "svg.fonttype": "none", "font.size": 10}):
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for series in chart.series:
            xs, ys = zip(*series.points) if series.points else ((), ())
            ax.plot(xs, ys, marker="o", markersize=4, label=series.label)
        if chart.x_line is not None:
            ax.axvline(chart.x_line, color="#888888", linestyle="--", linewidth=1)
            if chart.x_line_label:
                ax.annotate(chart.x_line_label, (chart.x_line, 1), xycoords=("data", "axes fraction"),
                            xytext=(3, -12), textcoords="offset points", color="#555555", fontsize=8)
        for label, x, y in chart.marks:
            ax.plot([x], [y], marker="*", markersize=12, color="#d62728", linestyle="none")
            ax.annotate(label, (x, y), xytext=(6, 6), textcoords="offset points", fontsize=8)
        if chart.log_x:
            ax.set_xscale("log")
        ax.set_title(chart.title, fontsize=10)
        ax.set_xlabel(chart.x_label)
        ax.set_ylabel(chart.y_label)
        ax.grid(True, alpha=0.3)
        if len(chart.series) > 1:
            ax.legend(fontsize=8)
        fig.tight_layout()
        out = io.BytesIO()
        fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return out.getvalue()


def render(results: Sequence[Results]) -> Tuple[str, Dict[str, bytes]]:
    """The page and its images (path relative to the page -> SVG bytes)."""
    images = {chart_file(c): draw(c) for r in results for c in r.charts}
    return render_markdown(results), images


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latte.bench.page", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"),
                        help="the results files (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"), help="default: %(default)s")
    args = parser.parse_args(argv)
    try:
        results = read_all(args.results)
    except ResultsError as exc:
        print(f"latte.bench.page: error: {exc}", file=sys.stderr)
        return 2
    if not results:
        print(f"latte.bench.page: error: no results files in {args.results}", file=sys.stderr)
        return 2
    page, images = render(results)
    image_dir = args.out.parent / IMAGES
    if image_dir.exists():
        for old in image_dir.glob("*.svg"):
            if f"{IMAGES}/{old.name}" not in images:
                old.unlink()
    for relative, data in images.items():
        path = args.out.parent / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(page)
    print(f"wrote {args.out} ({len(results)} results files, {len(images)} charts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
