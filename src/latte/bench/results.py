"""Benchmark results as data: one file per benchmark, its latest run only.

A file holds what the benchmark measured, summarised by the benchmark itself (tables, the
targets it checks, the curves worth drawing), and what a reader needs to trust it: the command
that reproduces it, the machine, the load average at the start, the date and the revision.
docs/benchmarks.md is rendered from these files (latte.bench.page) and never edited by hand;
earlier runs live in git.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from latte.backend.config import cpu_model, usable_cores

SCHEMA = 1
# The page's sections, in order: (area, heading).
AREAS: Tuple[Tuple[str, str], ...] = (
    ("serving", "Serving: latte against Triton's stock Python backend"),
    ("pipelines", "Pipelines: fused against Triton's ensemble"),
    ("streaming", "Streaming: continuous batching against a stock decoupled model"),
    ("generator", "Generator: derived settings against Model Analyzer"),
    ("allocator", "Allocator"),
    ("gpu", "GPU"),
    ("soak", "Soak"),
    ("reliability", "Self-healing: a model that dies or is rejuvenated"),
    ("overload", "Overload and priorities"),
    ("cache", "Response cache"),
    ("scheduler", "Scheduler and lanes"),
    ("planning", "Batch planning"),
)
VERDICTS = ("yes", "partly", "no")
# A list of numbers as json.dumps(indent=1) lays it out, an item a line: the newlines it writes
# between items never occur inside a JSON string, so no string's text is touched.
_NUMBER = r"-?[0-9][0-9.eE+-]*"
_NUMBER_LIST = re.compile(rf"\[\n *({_NUMBER}(?:,\n *{_NUMBER})*)\n *\]")
_ITEM_BREAK = re.compile(r",\n *")
RAW_OUTPUT_OPTIONS = ("--out", "--json", "--results-dir")


class ResultsError(ValueError):
    """A results file that does not hold what the page needs; the message names the file."""


@dataclass
class Table:
    caption: str
    columns: List[str]
    rows: List[List[str]]


@dataclass
class Target:
    """One target the benchmark checks, as the summary shows it."""
    target: str
    measured: str
    met: str            # one of VERDICTS
    why: str = ""       # what bounds it, where it is not met


@dataclass
class Series:
    label: str
    points: List[Tuple[float, float]]


@dataclass
class Chart:
    name: str           # the image's file name without its extension
    title: str
    x_label: str
    y_label: str
    series: List[Series]
    x_line: Optional[float] = None      # a vertical line, e.g. the P99 bound
    x_line_label: str = ""
    marks: List[Tuple[str, float, float]] = field(default_factory=list)   # (label, x, y)
    log_x: bool = False


@dataclass
class Results:
    benchmark: str      # the file's name: benchmarks/results/<benchmark>.json
    area: str           # one of AREAS
    title: str
    command: str
    machine: str
    load_at_start: Optional[float]
    date: str           # UTC, "YYYY-MM-DD HH:MM"
    revision: str
    summary: str = ""
    targets: List[Target] = field(default_factory=list)
    tables: List[Table] = field(default_factory=list)
    charts: List[Chart] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    figures: Optional[dict] = None      # the benchmark's raw figures, where it keeps them

    def to_json(self) -> str:
        text = json.dumps({"schema": SCHEMA, **asdict(self)}, indent=1, ensure_ascii=False)
        # A list of numbers on one line: a run's samples (a streaming run's first-token times)
        # would otherwise take a line each.
        return _NUMBER_LIST.sub(lambda m: "[" + _ITEM_BREAK.sub(", ", m.group(1)) + "]", text) + "\n"


def machine_description() -> str:
    cores = usable_cores()
    cpu = cpu_model()
    gpu = gpu_model()
    return (f"{platform.system()} {platform.machine()}, {cores} cores{', ' + cpu if cpu else ''}"
            f"{'; ' + gpu if gpu else ''}")


def gpu_model() -> str:
    """The GPUs nvidia-smi names, with the driver ('' without one): a GPU run names its device."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    gpus = [line.split(",") for line in done.stdout.splitlines() if "," in line]
    return ", ".join(f"{name.strip()} (driver {driver.strip()})" for name, driver in gpus)


def git_revision(where: Path) -> str:
    """The checked-out commit, with `+changes` when the work tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+changes" if dirty else "")


def paired_ratios(mine: Sequence[Mapping], theirs: Sequence[Mapping], key: str) -> List[float]:
    """mine[i][key] / theirs[i][key] for each pair measured side by side (a round, a window),
    where both have the figure."""
    return [a[key] / b[key] for a, b in zip(mine, theirs) if a[key] is not None and b[key]]


def ratio_against(value: Optional[float], limit: float = 1.0) -> str:
    """A ratio judged against LIMIT, as "0.93x", with a third digit where two would show the
    limit itself, so that the figure agrees with its verdict ("-": no ratio)."""
    if value is None:
        return "-"
    return f"{value:.3f}x" if round(value, 2) == limit and value != limit else f"{value:.2f}x"


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def new_results(benchmark: str, area: str, title: str, command: str, load_at_start: Optional[float],
                where: Path, date: Optional[str] = None) -> Results:
    """Results of a run on this machine that started at `date` (by default now), at the
    revision checked out in `where`."""
    return Results(benchmark=benchmark, area=area, title=title, command=command, machine=machine_description(),
                   load_at_start=cut_load(load_at_start), date=date or utc_now(), revision=git_revision(where))


def cut_load(load: Optional[float]) -> Optional[float]:
    """A load average as the page shows it, two decimals cut, not rounded: 0.497 is below the
    quiet line, and the page must not say 0.50."""
    # Rounded to a millionth first: 0.29 * 100 is 28.999..., which a floor alone makes 0.28.
    return None if load is None else math.floor(round(load * 100, 6)) / 100


def write_summary(results: Results, summary: Mapping, directory: Path, figures: Optional[dict] = None) -> Path:
    """`results` completed with what a benchmark made of its run (a mapping of `summary`,
    `targets`, `tables`, `charts`, `notes`) and its raw figures, written to `directory`."""
    return write_results(dataclasses.replace(results, **summary, figures=figures), directory)


def record_run(started: Results, run: Callable[[], dict], summarize: Callable[[dict], Mapping],
               directory: Path) -> Path:
    """Run a benchmark whose record was started before it (its date is the run's start) and write
    its results to `directory`: the load average the run measured at its start
    (`load_average_at_start` of its figures), what `summarize` makes of the figures, and the figures."""
    figures = run()
    measured = dataclasses.replace(started, load_at_start=cut_load(figures["load_average_at_start"]))
    return write_summary(measured, summarize(figures), directory, figures)


def write_results(results: Results, directory: Path) -> Path:
    check(results, f"{results.benchmark}.json")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{results.benchmark}.json"
    path.write_text(results.to_json())
    return path


def check(results: Results, source: str) -> None:
    """Refuse results the page could not show faithfully."""
    if results.area not in dict(AREAS):
        raise ResultsError(f"{source}: area {results.area!r} is not one of {', '.join(dict(AREAS))}")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2})?", results.date):
        raise ResultsError(f"{source}: date {results.date!r} is not 'YYYY-MM-DD HH:MM'")
    if not results.command.strip():
        raise ResultsError(f"{source}: no command reproduces these figures")
    for target in results.targets:
        if target.met not in VERDICTS:
            raise ResultsError(f"{source}: target {target.target!r} says met={target.met!r}; "
                               f"one of {', '.join(VERDICTS)}")
    for table in results.tables:
        for row in table.rows:
            if len(row) != len(table.columns):
                raise ResultsError(f"{source}: table {table.caption!r} has a row of {len(row)} cells under "
                                   f"{len(table.columns)} columns: {row}")
    names = [chart.name for chart in results.charts]
    if len(set(names)) != len(names) or any(not re.fullmatch(r"[a-z0-9][a-z0-9-]*", n) for n in names):
        raise ResultsError(f"{source}: chart names must be distinct, lowercase, with dashes: {names}")


def read_results(path: Path) -> Results:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{path.name}: cannot be read: {exc}") from None
    if data.pop("schema", None) != SCHEMA:
        raise ResultsError(f"{path.name}: not a results file of schema {SCHEMA}")
    try:
        results = Results(**{**data,
                             "targets": [Target(**t) for t in data.get("targets", [])],
                             "tables": [Table(**t) for t in data.get("tables", [])],
                             "charts": [Chart(**{**c, "series": [Series(s["label"], [tuple(p) for p in s["points"]])
                                                                 for s in c["series"]],
                                                 "marks": [tuple(m) for m in c.get("marks", [])]})
                                        for c in data.get("charts", [])]})
    except (TypeError, KeyError) as exc:
        raise ResultsError(f"{path.name}: {exc}") from None
    if results.benchmark != path.stem:
        raise ResultsError(f"{path.name}: names benchmark {results.benchmark!r}; the file must be named after it")
    check(results, path.name)
    return results


def read_all(directory: Path) -> List[Results]:
    """Every results file of `directory`, in the page's order: by area, then the newest run first."""
    order = {area: i for i, (area, _) in enumerate(AREAS)}
    found = [read_results(path) for path in sorted(Path(directory).glob("*.json"))]
    found.sort(key=lambda r: r.date, reverse=True)
    return sorted(found, key=lambda r: order[r.area])


def by_area(results: Sequence[Results]) -> Dict[str, List[Results]]:
    grouped: Dict[str, List[Results]] = {}
    for r in results:
        grouped.setdefault(r.area, []).append(r)
    return grouped


def command_line(script: str, argv: Optional[Sequence[str]], python: str = ".venv/bin/python") -> str:
    """How to run it again, as a reader would type it from the repository root (with `python`):
    the run's arguments less where it wrote its figures (`--out`, `--json`, `--results-dir`:
    paths that need not exist elsewhere). A run made by a script (scripts/gpu_serve.sh) names the
    script instead, through LATTE_RESULTS_COMMAND."""
    if os.environ.get("LATTE_RESULTS_COMMAND"):
        return os.environ["LATTE_RESULTS_COMMAND"]
    args, kept = list(sys.argv[1:] if argv is None else argv), []
    while args:
        arg = args.pop(0)
        if arg in RAW_OUTPUT_OPTIONS:
            args = args[1:]
        elif arg.split("=")[0] not in RAW_OUTPUT_OPTIONS:
            kept.append(arg)
    return " ".join([python, script, *(shlex.quote(a) for a in kept)])
