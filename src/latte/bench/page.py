"""docs/benchmarks.md and a page per area (docs/benchmarks/<area>.md), rendered from
benchmarks/results/*.json with their charts.

    .venv/bin/python -m latte.bench.page

The pages hold today's figures only. docs/benchmarks.md counts each area's targets met and
lists every target with its figure, each linked to its run on the area's page. An area's page
has each of its benchmarks: the command, machine, load and revision that produced it, its
tables and charts, its notes, and what is not met and why. A test renders them again and
compares (a figure typed into a page by hand fails it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from latte.bench.quiet import QUIET_LOAD
from latte.bench.results import AREAS, Chart, Results, ResultsError, Table, by_area, read_all

MAIN = "benchmarks.md"
AREA_PAGES = "benchmarks"       # the areas' pages, relative to the main page
IMAGES = "img/benchmarks"       # relative to the main page
RENDERED = "Today's figures, rendered from `benchmarks/results/*.json` by\n`.venv/bin/python -m latte.bench.page`"
HEADER = f"""# Benchmarks

{RENDERED}; do not edit these pages by hand. Each area has a page
of its own: every run's command (run from the repository root), the machine, the 1-minute load
average when it started, the date (UTC) and the revision, its tables and charts, and why a
target is not met. Each benchmark run rewrites its results file, and git keeps the earlier runs.
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


def area_page(area: str) -> str:
    """An area's page, relative to the main page: benchmarks/serving.md."""
    return f"{AREA_PAGES}/{area}.md"


def area_title(heading: str) -> str:
    """'Serving: latte against ...' -> 'Serving benchmarks: latte against ...'."""
    name, colon, rest = heading.partition(":")
    return f"{name} benchmarks{colon}{rest}"


def short_name(area: str) -> str:
    return dict(AREAS)[area].split(":")[0]


def summary_table(results: Sequence[Results]) -> Table:
    rows = []
    for r in results:
        link = f"[{short_name(r.area)}]({area_page(r.area)}#{anchor(r.title)})"
        rows += [[link, t.target, t.measured, t.met] for t in r.targets]
    return Table("", ["area", "target", "measured", "met"], rows)


def glance_table(results: Sequence[Results]) -> Table:
    """Per area, how many of its targets are met: the page in a few lines."""
    counts: Dict[str, Dict[str, int]] = {}
    for r in results:
        tally = counts.setdefault(r.area, {"yes": 0, "partly": 0, "no": 0})
        for t in r.targets:
            tally[t.met] += 1
    rows = []
    for area, _ in AREAS:
        if area in counts:
            tally = counts[area]
            total = sum(tally.values())
            rows.append([f"[{short_name(area)}]({area_page(area)})", f"{tally['yes']} of {total}",
                         str(tally["partly"]), str(tally["no"])])
    return Table("", ["area", "targets met", "partly", "not met"], rows)


def chart_file(chart: Chart) -> str:
    """The chart's image, relative to the main page."""
    return f"{IMAGES}/{chart.name}.svg"


def section(r: Results) -> List[str]:
    """One run on its area's page."""
    load = "not recorded as one figure" if r.load_at_start is None else f"{r.load_at_start:.2f}"
    quiet = "" if r.load_at_start is None or r.load_at_start < QUIET_LOAD else f" (above {QUIET_LOAD}: not a quiet machine)"
    lines = [f"## {r.title}", "",
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
        lines += [f"![{chart.title}](../{chart_file(chart)})", ""]
    lines += [f"- {note}" for note in r.notes] + ([""] if r.notes else [])
    missed = [t for t in r.targets if t.met != "yes"]
    if missed:
        lines += ["Not met:", ""] + [f"- {t.target}: {t.met}, {t.measured}" + (f". Why: {t.why}." if t.why else ".")
                                     for t in missed] + [""]
    elif r.targets:
        lines += ["Every target of this run is met.", ""]
    return lines


def _page(lines: List[str]) -> str:
    return "\n".join(lines).rstrip("\n") + "\n"


def render_markdown(results: Sequence[Results]) -> str:
    """The main page: each area's targets counted, then every target with its figure."""
    lines = [HEADER, "## At a glance", ""] + markdown_table(glance_table(results)) + [""]
    lines += ["## Summary", "", "Each target links to its run, where a target not met says why.", ""]
    lines += markdown_table(summary_table(results))
    return _page(lines)


def render_area(heading: str, results: Sequence[Results]) -> str:
    """An area's page: each of its runs in full."""
    lines = [f"# {area_title(heading)}", "",
             f"[All areas](../{MAIN}). {RENDERED}; every command runs from the repository root.", ""]
    for r in results:
        lines += section(r)
    return _page(lines)


def render_pages(results: Sequence[Results]) -> Dict[str, str]:
    """Every page by its path relative to the main page's folder: benchmarks.md, benchmarks/<area>.md."""
    pages = {MAIN: render_markdown(results)}
    grouped = by_area(results)
    for area, heading in AREAS:
        if area in grouped:
            pages[area_page(area)] = render_area(heading, grouped[area])
    return pages


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


def render(results: Sequence[Results]) -> Tuple[Dict[str, str], Dict[str, bytes]]:
    """The pages and their images, each by its path relative to the main page's folder."""
    images = {chart_file(c): draw(c) for r in results for c in r.charts}
    return render_pages(results), images


def _remove_stale(folder: Path, pattern: str, kept: Dict[str, object], root: Path) -> None:
    """Files of an area or a chart no results file has any more."""
    if folder.exists():
        for old in folder.glob(pattern):
            if old.relative_to(root).as_posix() not in kept:
                old.unlink()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m latte.bench.page", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"),
                        help="the results files (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks.md"),
                        help="the main page; the areas' pages go to benchmarks/ beside it (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        results = read_all(args.results)
    except ResultsError as exc:
        print(f"latte.bench.page: error: {exc}", file=sys.stderr)
        return 2
    if not results:
        print(f"latte.bench.page: error: no results files in {args.results}", file=sys.stderr)
        return 2
    pages, images = render(results)
    root = args.out.parent
    _remove_stale(root / IMAGES, "*.svg", images, root)
    _remove_stale(root / AREA_PAGES, "*.md", pages, root)
    for relative, data in images.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for relative, text in pages.items():
        path = args.out if relative == MAIN else root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {args.out} and {len(pages) - 1} area pages ({len(results)} results files, {len(images)} charts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
