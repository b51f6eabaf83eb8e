"""docs/benchmarks.md and its areas' pages (docs/benchmarks/<area>.md) are rendered from
benchmarks/results/*.json: the pages, their charts and README's figures agree with the results
files, the main page reads in a minute, every link between the pages resolves, and a results
file the pages could not show faithfully is refused with a line that names it."""

import os
import re
from pathlib import Path

import pytest

from latte.bench.page import anchor, chart_file, render_area, render_markdown, render_pages
from latte.bench.results import (AREAS, Chart, Results, ResultsError, Series, Table, Target, read_all, read_results,
                                 write_results)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
PAGE = DOCS / "benchmarks.md"
AREA_PAGES = DOCS / "benchmarks"
# A reader takes the main page in at a glance; a cell stays within a line or two.
MAIN_PAGE_LINES = 150
CELL_CHARS = 200
# A ratio (3.78x), a percentage (+0.2 %), or a range of either (3.28-4.46x).
FIGURE = re.compile(r"([+\-−]?\d[\d,]*(?:\.\d+)?)(?:[-–]([+\-−]?\d[\d,]*(?:\.\d+)?))?(x\b|\s?%)")


def normalized(text: str) -> str:
    return re.sub(r"\s+%", "%", text.replace("−", "-").replace("**", ""))


def figures_of(text: str):
    """Each figure of `text` as it would be written alone: '3.28x', '+0.2%'."""
    found = []
    for match in FIGURE.finditer(normalized(text)):
        unit = match.group(3).strip()
        found += [f"{value}{unit}" for value in match.groups()[:2] if value]
    return found


def appears(figure: str, page: str) -> bool:
    unsigned = figure.lstrip("+-")
    return re.search(r"(?<![\d.,])[+\-]?" + re.escape(unsigned) + r"(?![\d])", page) is not None


def test_the_pages_are_what_their_results_render():
    rendered = render_pages(read_all(RESULTS))
    for relative, text in rendered.items():
        assert (DOCS / relative).read_text() == text, \
            f"docs/{relative} differs from benchmarks/results: run .venv/bin/python -m latte.bench.page"
    on_disk = {f"benchmarks/{p.name}" for p in AREA_PAGES.glob("*.md")}
    assert on_disk == set(rendered) - {"benchmarks.md"}, "an area page no results file renders"


def test_every_chart_is_on_disk_and_shown_on_its_areas_page():
    results = read_all(RESULTS)
    assert any(r.charts for r in results), "the pages have no charts"
    for r in results:
        for chart in r.charts:
            assert (DOCS / chart_file(chart)).is_file(), chart_file(chart)
            assert f"](../{chart_file(chart)})" in (AREA_PAGES / f"{r.area}.md").read_text()


def table_cells(text: str):
    """Every cell of every markdown table of `text` (an escaped pipe stays inside its cell)."""
    return [cell.strip() for line in text.splitlines() if line.startswith("|")
            for cell in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_the_main_page_is_short_and_links_each_areas_page():
    main = PAGE.read_text()
    assert len(main.splitlines()) <= MAIN_PAGE_LINES
    for area in {r.area for r in read_all(RESULTS)}:
        assert f"](benchmarks/{area}.md)" in main, area
        assert (AREA_PAGES / f"{area}.md").is_file(), area
    assert "Measured " not in main and "    .venv/bin/python" not in main  # the runs are on their areas' pages


def test_no_cell_of_any_page_runs_over_a_line_or_two():
    for page in [PAGE, *AREA_PAGES.glob("*.md")]:
        cells = table_cells(page.read_text())
        assert cells, page.name
        longest = max(cells, key=len)
        assert len(longest) <= CELL_CHARS, f"{page.name}: a cell of {len(longest)} characters: {longest[:80]}..."


def test_table_cells_are_split_at_unescaped_pipes_only():
    assert table_cells("| a | b \\| c |\n|---|---|\ntext | not a row\n") == ["a", "b \\| c", "---", "---"]


LINK = re.compile(r"\]\(([^)\s]+)\)")


def headings_anchors(text: str):
    return {anchor(line.lstrip("#").strip()) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def links_to_the_pages():
    """(page, target) of every link on the benchmark pages, and of README's and the docs' links to them."""
    for page in [PAGE, *AREA_PAGES.glob("*.md")]:
        yield from ((page, target) for target in LINK.findall(page.read_text()) if "://" not in target)
    for page in [ROOT / "README.md", *(p for p in DOCS.glob("*.md") if p != PAGE)]:
        yield from ((page, target) for target in LINK.findall(page.read_text()) if "benchmarks.md" in target
                    or "benchmarks/" in target and target.endswith(".md"))


def test_every_link_to_and_between_the_pages_resolves():
    checked = 0
    for page, target in links_to_the_pages():
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.is_file(), f"{page.name}: {target}"
        if fragment:
            assert fragment in headings_anchors(resolved.read_text()), f"{page.name}: {target}"
        checked += 1
    assert checked > 100, checked  # the summary's rows, the areas' pages, their charts


def test_a_link_to_a_heading_that_is_not_there_is_caught():
    text = "# Serving benchmarks\n\n## Serving ranker: latte against the stock Python backend\n"
    assert "serving-ranker-latte-against-the-stock-python-backend" in headings_anchors(text)
    assert "serving-ranker" not in headings_anchors(text)
    assert LINK.findall("[a](benchmarks/gpu.md#x) and ![c](../img/b.svg)") == ["benchmarks/gpu.md#x", "../img/b.svg"]


def test_each_figure_readme_states_is_on_the_pages():
    readme = (ROOT / "README.md").read_text()
    pages = normalized("\n".join(p.read_text() for p in [PAGE, *AREA_PAGES.glob("*.md")]))
    stated = figures_of(readme)
    assert len(stated) >= 10, stated
    missing = [f for f in stated if not appears(f, pages)]
    assert not missing, f"README states figures that docs/benchmarks.md and its areas' pages do not hold: {missing}"


def test_a_figure_not_on_the_page_is_caught():
    assert figures_of("serves 3.28-4.46x and −28.5 % at P99") == ["3.28x", "4.46x", "-28.5%"]
    assert appears("3.28x", "| text | 3.28x |")
    assert not appears("1.10x", "| text | 11.10x |")
    assert not appears("4.4x", "| text | 4.46x |")


def example(**changes) -> Results:
    results = Results(benchmark="example", area="serving", title="An example", command=".venv/bin/python x.py",
                      machine="Linux x86_64, 2 cores", load_at_start=0.3, date="2026-11-25 10:00", revision="abc1234",
                      targets=[Target("latte ≥ 1.0x the stock loop", "1.20x", "yes")],
                      tables=[Table("", ["model", "ratio"], [["ranker", "1.20x"]])],
                      charts=[Chart("serving-example", "t", "P99 ms", "infer/s", [Series("latte", [(1.0, 2.0)])])])
    for key, value in changes.items():
        setattr(results, key, value)
    return results


def test_results_written_read_back_the_same(tmp_path):
    path = write_results(example(), tmp_path)
    assert path.name == "example.json"
    assert read_results(path) == example()


def test_lists_of_numbers_are_written_on_one_line_and_every_string_as_it_was(tmp_path):
    notes = ["levels [ 1,  16 ]", "[1,\u00a02]", "[\n 3,\n 4\n]"]
    figures = {"samples": [-1.5e-07, 2, 3.25, 1e+22], "nested": [[1, 2], [3]], "empty": [], "mixed": [1, "a"],
               "not a number": [float("inf"), 1.0]}
    path = write_results(example(notes=notes, figures=figures), tmp_path)
    text = path.read_text()
    assert '"samples": [-1.5e-07, 2, 3.25, 1e+22]' in text
    assert '"nested": [\n   [1, 2],\n   [3]\n  ]' in text
    back = read_results(path)
    assert back.notes == notes
    assert back.figures == figures


def test_a_verdict_other_than_yes_partly_no_is_refused(tmp_path):
    with pytest.raises(ResultsError, match=r"example.json: target 'latte ≥ 1.0x the stock loop' says "
                                           r"met='maybe'; one of yes, partly, no"):
        write_results(example(targets=[Target("latte ≥ 1.0x the stock loop", "1.2x", "maybe")]), tmp_path)


def test_a_row_that_does_not_fit_its_columns_is_refused(tmp_path):
    with pytest.raises(ResultsError, match="has a row of 1 cells under 2 columns"):
        write_results(example(tables=[Table("short", ["model", "ratio"], [["ranker"]])]), tmp_path)


def test_results_without_a_command_or_in_no_known_area_are_refused(tmp_path):
    with pytest.raises(ResultsError, match="no command reproduces these figures"):
        write_results(example(command=" "), tmp_path)
    with pytest.raises(ResultsError, match=f"area 'speed' is not one of {', '.join(a for a, _ in AREAS)}"):
        write_results(example(area="speed"), tmp_path)


def test_a_file_named_otherwise_than_its_benchmark_is_refused(tmp_path):
    path = write_results(example(), tmp_path)
    path.rename(tmp_path / "other.json")
    with pytest.raises(ResultsError, match="other.json: names benchmark 'example'"):
        read_results(tmp_path / "other.json")


def test_the_summary_links_each_target_to_its_run_whose_areas_page_says_why_it_is_not_met():
    run = example(targets=[Target("a", "0.9x", "no", why="the box"), Target("b", "2x", "yes")])
    main = render_markdown([run])
    assert "| [Serving](benchmarks/serving.md#an-example) | a | 0.9x | no |" in main
    assert "| [Serving](benchmarks/serving.md#an-example) | b | 2x | yes |" in main
    assert "the box" not in main
    area = render_pages([run])["benchmarks/serving.md"]
    assert area.startswith("# Serving benchmarks: latte against Triton's stock Python backend\n")
    assert "[All areas](../benchmarks.md)" in area
    assert "- a: no, 0.9x. Why: the box." in area
    assert "## An example" in area and "    .venv/bin/python x.py" in area
    assert "![t](../img/benchmarks/serving-example.svg)" in area


def test_a_load_above_the_quiet_line_is_said_on_the_areas_page():
    assert "load average at the start 0.80 (above 0.5: not a quiet machine)" in \
        render_area("Serving", [example(load_at_start=0.8)])
    assert "load average at the start 0.30;" in render_area("Serving", [example()])


def commands_of_the_page():
    """(script, flags) of each command the results name: `.venv/bin/python benchmarks/x.py --a 1`,
    or a script that runs benchmarks on another machine: `MEMORY_S=150 scripts/gpu_serve.sh`."""
    found = set()
    for r in read_all(RESULTS):
        for part in r.command.split("&&"):
            words = part.split()
            scripts = [w for w in words if (w.startswith("benchmarks/") and w.endswith(".py"))
                       or (w.startswith("scripts/") and w.endswith(".sh"))]
            assert len(scripts) == 1, f"{r.benchmark}: {part!r} runs no benchmark script"
            flags = tuple(sorted({w.split("=")[0] for w in words if w.startswith("--")}))
            found.add((scripts[0], flags))
    return sorted(found)


@pytest.mark.parametrize("script,flags", commands_of_the_page())
def test_each_command_on_the_page_names_a_script_and_flags_it_has(script, flags):
    import subprocess
    import sys

    assert (ROOT / script).is_file(), script
    if script.endswith(".sh"):
        # Run on a lent GPU machine, not here: it parses, runs as typed, and takes each flag shown.
        assert os.access(ROOT / script, os.X_OK), script
        assert subprocess.run(["bash", "-n", script], cwd=ROOT).returncode == 0
        assert not [f for f in flags if f not in (ROOT / script).read_text()], flags
        return
    shown = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert not [f for f in flags if f not in shown.stdout], shown.stdout


def test_a_recorded_command_leaves_out_where_the_run_wrote_its_figures():
    from latte.bench.results import command_line

    assert command_line("benchmarks/serving.py", ["--model", "ranker", "--out", "/tmp/x.json", "--results-dir=/tmp/r",
                                                  "--rounds", "3"]) == \
        ".venv/bin/python benchmarks/serving.py --model ranker --rounds 3"
    assert command_line("benchmarks/lanes_cores.py", ["--json", "build/gpu/lanes.json", "--lanes", "2,4"],
                        python="PYTHONPATH=build/gpu-site python3") == \
        "PYTHONPATH=build/gpu-site python3 benchmarks/lanes_cores.py --lanes 2,4"


def test_a_summary_fills_the_results_and_an_unknown_field_is_refused(tmp_path):
    from latte.bench.results import write_summary

    path = write_summary(example(targets=[]), {"summary": "one run", "targets": [Target("t", "1x", "yes")]}, tmp_path,
                         {"raw": 1})
    written = read_results(path)
    assert (written.summary, written.targets[0].target, written.figures) == ("one run", "t", {"raw": 1})
    with pytest.raises(TypeError, match="speed"):
        write_summary(example(), {"speed": "fast"}, tmp_path)


def test_a_recorded_run_keeps_its_start_date_and_the_load_it_measured(tmp_path):
    from latte.bench.results import record_run

    started = example(targets=[], load_at_start=None, date="2026-11-25 09:00")
    path = record_run(started, lambda: {"load_average_at_start": 0.4956, "rate": 7},
                      lambda figures: {"summary": f"rate {figures['rate']}"}, tmp_path)
    written = read_results(path)
    assert (written.date, written.load_at_start, written.summary) == ("2026-11-25 09:00", 0.49, "rate 7")
    assert written.figures == {"load_average_at_start": 0.4956, "rate": 7}
    assert started.load_at_start is None  # the started record is left as it was


def test_a_load_just_under_the_quiet_line_is_not_shown_above_it():
    from latte.bench.results import cut_load

    assert cut_load(0.4956) == 0.49 and cut_load(0.5) == 0.5 and cut_load(None) is None
    assert [cut_load(x) for x in (0.29, 0.57, 1.13)] == [0.29, 0.57, 1.13]


def test_the_page_opens_with_each_areas_targets_counted():
    page = render_markdown([example(targets=[Target("a", "0.9x", "no"), Target("b", "2x", "yes"),
                                             Target("c", "1.1x", "partly")]),
                            example(benchmark="other", area="soak", title="A soak")])
    assert page.index("## At a glance") < page.index("## Summary")
    assert "| [Serving](benchmarks/serving.md) | 1 of 3 | 1 | 1 |" in page
    assert "| [Soak](benchmarks/soak.md) | 1 of 1 | 0 | 0 |" in page


def test_a_runs_first_table_shows_and_the_rest_fold_away():
    tables = [Table("", ["model", "ratio"], [["ranker", "1.20x"]]),
              Table("Level by level:", ["level", "ratio"], [["1", "0.9x"]]),
              Table("CPU per request:", ["level", "us"], [["1", "300"]])]
    page = render_area("Serving", [example(tables=tables)])
    headline, folded = page.index("| ranker | 1.20x |"), page.index("<details>")
    assert headline < folded < page.index("Level by level:") < page.index("CPU per request:") < page.index("</details>")
    assert "<summary>2 more tables</summary>" in page
    assert "<details>" not in render_area("Serving", [example()])  # one table: nothing to fold
