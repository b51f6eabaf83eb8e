"""What the page makes of an in-process allocator run (benchmarks/gpu_allocator.py): the paged
arena's targets under a cap, the capped runs' table, and the reasons given for a missed target."""

import json
import sys

import pytest

import bench_scripts
from latte.bench.results import ratio_against

MIB = 1 << 20


@pytest.fixture(scope="module")
def gpu_allocator():
    return bench_scripts.load("gpu_allocator")


def run(contender, held_mib, ooms=0, cap=0, p99=1.0, model="encoder", arena=None):
    figures = {"model": model, "contender": contender, "cap": cap, "steps": 3000 if cap else 6000, "ooms": ooms,
               "peak_live": 360 * MIB, "peak_held": held_mib * MIB, "p50_ms": p99 / 2, "p99_ms": p99,
               "timeline": [{"step": 0, "held": held_mib * MIB, "live": 360 * MIB, "peak_held": held_mib * MIB,
                             "peak_live": 360 * MIB}]}
    return figures if arena is None else {**figures, "arena": arena}


def encoder_runs(paged_ooms=0, paged_held=512, paged_p99=1.0, arena_p99=1.0):
    cap = 396 * MIB
    return [run("caching", 992), run("expandable", 434), run("arena", 358, p99=arena_p99),
            run("arena_paged", paged_held, p99=paged_p99, arena={"map_calls": 1695, "unmap_calls": 31}),
            run("caching", 368, ooms=2, cap=cap), run("expandable", 354, cap=cap), run("arena", 313, ooms=9, cap=cap),
            run("arena_paged", 396, ooms=paged_ooms, cap=cap)]


def targets(summary):
    return {t.target: t for t in summary["targets"]}


HELD = "arena-backed torch holds ≤ 0.8x the caching allocator's reserved memory"
P99 = "P99 per step ≤ 1.0x the caching allocator's"
CAPPED = "under a cap, no more OOMs than the caching allocator"
PAGED_OOM = "paged arena: 0 OOMs under the cap (caching and expandable alongside)"
PAGED = "paged arena: held ≤ 0.5x and P99 ≤ 1.0x the caching allocator's"
CAP = 396 * MIB


# No round had both a caching run and an arena run.
UNPAIRED = [{**run("caching", 992), "round": 0, "error": "CUDA error"}, {**run("arena", 358), "round": 0},
            {**run("arena_paged", 400), "round": 0}, {**run("caching", 992), "round": 1},
            {**run("arena", 358), "round": 1, "error": "CUDA error"},
            {**run("arena_paged", 400), "round": 1, "error": "CUDA error"},
            run("caching", 368, ooms=2, cap=CAP), run("arena_paged", 396, cap=CAP)]


# Each target's figure and verdict, from the runs that decide them (encoder_runs: caching holds
# 992 MiB; under the cap, caching 2 OOMs, expandable 0, arena 9).
VERDICTS = [
    # the paged arena without an OOM under the cap meets that target; the plain arena's 9 do not
    (encoder_runs(), PAGED_OOM, "encoder: 0 (caching 2, expandable 0)", "yes"),
    (encoder_runs(paged_ooms=1), PAGED_OOM, "encoder: 1 (caching 2, expandable 0)", "no"),
    (encoder_runs(), CAPPED, None, "no"),
    # held over the caching allocator's: 512 / 992 = 0.52x misses 0.5x, 400 / 992 = 0.40x meets it
    (encoder_runs(), PAGED, "encoder 0.52x / 1.00x", "no"),
    (encoder_runs(paged_held=400), PAGED, "encoder 0.40x / 1.00x", "yes"),
    (encoder_runs(paged_held=400, paged_p99=1.02), PAGED, "encoder 0.40x / 1.02x", "no"),
    # a ratio that two digits would round to 1.00x shows its third, and misses
    (encoder_runs(arena_p99=1.002), P99, "encoder 1.002x", "no"),
    # judged on the ratio, not on the ratio as printed: 0.803x prints as 0.80x with two digits
    ([run("caching", 1000), run("arena", 803)], HELD, "encoder 0.803x", "no"),
    ([run("caching", 1000), run("arena", 358)], HELD, "encoder 0.36x", "yes"),
    # a round without its caching run has no P99 ratio: shown as none, and missed
    (UNPAIRED, P99, "encoder -", "no"),
    (UNPAIRED, PAGED, "encoder 0.40x / -", "no"),
]


@pytest.mark.parametrize("results,target,measured,met", VERDICTS)
def test_each_target_is_judged_on_its_figure(gpu_allocator, results, target, measured, met):
    found = targets(gpu_allocator.summarize(results, "a GPU", 6000))[target]
    assert found.met == met
    if measured is not None:
        assert found.measured == measured


def test_a_missed_paged_target_gives_the_figures_that_bound_it(gpu_allocator):
    held = targets(gpu_allocator.summarize(encoder_runs(), "a GPU", 6000))[PAGED]
    # The bound in figures: 992 / 360 MiB against 512 / 360 MiB.
    assert held.why.endswith("held ≤ 0.5x needs the caching allocator to hold at least twice the paged arena's own "
                             "held / live: encoder caching 2.76x, paged 1.42x")
    slower = targets(gpu_allocator.summarize(encoder_runs(paged_held=400, paged_p99=1.02), "a GPU", 6000))[PAGED]
    assert "encoder 1,695 map and 31 unmap calls in 6,000 steps" in slower.why


def test_the_capped_runs_have_a_table_of_their_own(gpu_allocator):
    tables = gpu_allocator.summarize(encoder_runs(), "a GPU", 6000)["tables"]
    capped = next(t for t in tables if "under a cap" in t.caption)
    assert capped.caption.startswith("encoder under a cap of 396 MiB (1.10x the caching allocator's peak live)")
    assert [row[:2] for row in capped.rows] == [["caching", "2"], ["expandable", "0"], ["arena", "9"],
                                                 ["arena_paged", "0"]]


def test_a_ratio_is_written_with_the_digits_that_tell_it_from_its_target():
    assert ratio_against(0.996) == "0.996x"
    assert ratio_against(1.0) == "1.00x"
    assert ratio_against(1.03) == "1.03x"
    assert ratio_against(0.504, 0.5) == "0.504x"
    assert ratio_against(0.5, 0.5) == "0.50x"
    assert ratio_against(None) == "-"


def rounds_of(contender, held_mib, p99s):
    """One uncapped run of CONTENDER per round, its P99 that round's."""
    return [{**run(contender, held_mib, p99=p99), "round": r} for r, p99 in enumerate(p99s)]


def test_rounds_give_one_row_per_contender_and_the_median_of_each_rounds_p99_ratio(gpu_allocator):
    # The machine is slower in round 1 for everyone: the ratio within each round is what counts.
    results = (rounds_of("caching", 992, [1.0, 2.0, 1.0]) + rounds_of("arena", 358, [0.98, 1.90, 1.03])
               + rounds_of("arena_paged", 400, [1.05, 1.96, 0.99]))
    rows = {r["contender"]: r for r in gpu_allocator.by_contender(results, "encoder")}
    assert list(rows) == ["caching", "arena", "arena_paged"]
    assert rows["arena"]["p99_rounds"] == pytest.approx([0.98, 0.95, 1.03])
    assert rows["arena"]["p99_vs"] == pytest.approx(0.98)
    assert rows["arena_paged"]["p99_vs"] == pytest.approx(0.99)
    assert rows["arena_paged"]["p99_ms"] == pytest.approx(1.05)  # the median of its own P99s
    assert rows["caching"]["rounds"] == 3
    summary = gpu_allocator.summarize(results, "a GPU", 3000)
    table = summary["tables"][0]
    assert table.caption == "encoder, 3,000 steps per contender, medians of 3 interleaved rounds:"
    assert table.columns[-1] == "P99 vs caching, each round"
    assert table.rows[1][-2:] == ["0", "0.98, 0.95, 1.03"]
    assert targets(summary)[P99].measured == "encoder 0.98x"
    # One round keeps the table it had: no column of rounds.
    one = gpu_allocator.summarize(encoder_runs(), "a GPU", 6000)["tables"][0]
    assert (one.caption, one.columns[-1]) == ("encoder, 6,000 steps per contender:", "OOMs")


def test_a_round_without_its_caching_run_gives_no_ratio_of_its_own(gpu_allocator):
    results = (rounds_of("caching", 992, [1.0, 1.0]) + rounds_of("arena", 358, [0.9, 1.2, 5.0]))
    results[1] = {**results[1], "error": "CUDA error: out of memory"}
    rows = {r["contender"]: r for r in gpu_allocator.by_contender(results, "encoder")}
    assert rows["arena"]["p99_rounds"] == pytest.approx([0.9])
    assert rows["caching"]["rounds"] == 1


def test_the_parent_interleaves_the_rounds_then_runs_the_cap_once(gpu_allocator, monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "a GPU")
    ran = []

    def run_contender(model, contender, steps, seed, cap, arena_bytes):
        ran.append((contender, steps, cap))
        return run(contender, 500, cap=cap or 0, p99=1.0)

    monkeypatch.setattr(gpu_allocator, "run_contender", run_contender)
    monkeypatch.setattr(sys, "argv", ["gpu_allocator.py", "--models", "encoder", "--contenders", "caching,arena,arena_paged",
                                      "--steps", "100", "--rounds", "3", "--cap-steps", "50", "--cap-ratio", "1.10",
                                      "--results-dir", str(tmp_path)])
    assert gpu_allocator.main() == 0
    assert [c for c, steps, cap in ran if not cap] == ["caching", "arena", "arena_paged", "arena", "arena_paged",
                                                       "caching", "arena_paged", "caching", "arena"]
    # The cap right after the first round: a budget that runs short costs further rounds only.
    assert [bool(cap) for _, _, cap in ran] == [False] * 3 + [True] * 3 + [False] * 6
    assert [(c, steps) for c, steps, cap in ran if cap] == [("caching", 50), ("arena", 50), ("arena_paged", 50)]
    written = json.loads((tmp_path / "gpu-allocator-encoder.json").read_text())
    assert written["tables"][0]["caption"] == "encoder, 100 steps per contender, medians of 3 interleaved rounds:"


def test_rounds_below_one_are_refused(gpu_allocator, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu_allocator.py", "--rounds", "0"])
    with pytest.raises(SystemExit):
        gpu_allocator.main()
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err


def test_a_round_the_budget_cut_short_is_left_out_of_the_medians(gpu_allocator):
    results = (rounds_of("caching", 992, [1.0]) + rounds_of("arena", 358, [0.9]) + rounds_of("arena_paged", 400, [0.95])
               + [{**run("caching", 992, p99=3.0), "round": 1}])  # the budget ran out after round 2's first run
    rows = {r["contender"]: r for r in gpu_allocator.by_contender(results, "encoder")}
    assert rows["caching"]["rounds"] == 1 and rows["caching"]["p99_ms"] == pytest.approx(1.0)
    assert rows["arena"]["p99_vs"] == pytest.approx(0.9)
    assert gpu_allocator.summarize(results, "a GPU", 3000)["tables"][0].caption == "encoder, 3,000 steps per contender:"
