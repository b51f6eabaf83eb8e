"""What the page makes of an in-process allocator run (benchmarks/gpu_allocator.py): the paged
arena's targets under a cap, the capped runs' table, and the reasons given for a missed target."""

import pytest

import bench_scripts

MIB = 1 << 20


@pytest.fixture(scope="module")
def gpu_allocator():
    return bench_scripts.load("gpu_allocator")


def run(contender, held_mib, ooms=0, cap=0, p99=1.0, model="encoder", arena=None):
    figures = {"model": model, "contender": contender, "cap": cap, "steps": 3000 if cap else 6000, "ooms": ooms,
               "peak_live": 360 * MIB, "peak_held": held_mib * MIB, "p50_ms": p99 / 2, "p99_ms": p99,
               "timeline": [{"step": 0, "held": held_mib * MIB}]}
    return figures if arena is None else {**figures, "arena": arena}


def encoder_runs(paged_ooms=0, paged_held=512, paged_p99=1.0, arena_p99=1.0):
    cap = 396 * MIB
    return [run("caching", 992), run("expandable", 434), run("arena", 358, p99=arena_p99),
            run("arena_paged", paged_held, p99=paged_p99, arena={"map_calls": 1695, "unmap_calls": 31}),
            run("caching", 368, ooms=2, cap=cap), run("expandable", 354, cap=cap), run("arena", 313, ooms=9, cap=cap),
            run("arena_paged", 396, ooms=paged_ooms, cap=cap)]


def targets(summary):
    return {t.target: t for t in summary["targets"]}


def test_the_paged_arena_without_an_oom_under_the_cap_meets_that_target(gpu_allocator):
    found = targets(gpu_allocator.summarize(encoder_runs(), "a GPU", 6000))
    oom = found["paged arena: 0 OOMs under the cap (caching and expandable alongside)"]
    assert (oom.met, oom.measured) == ("yes", "encoder: 0 (caching 2, expandable 0)")
    plain = found["under a cap, no more OOMs than the caching allocator"]
    assert plain.met == "no" and "power-of-two pieces" in plain.why and "its targets below" in plain.why


def test_a_paged_arena_holding_more_than_half_the_caching_allocators_says_why(gpu_allocator):
    held = targets(gpu_allocator.summarize(encoder_runs(), "a GPU", 6000))[
        "paged arena: held ≤ 0.5x and P99 ≤ 1.0x the caching allocator's"]
    assert (held.met, held.measured) == ("no", "encoder 0.52x / 1.00x")
    assert "up to half the pages in use" in held.why and "a smaller share holds less and waits more" in held.why
    assert targets(gpu_allocator.summarize(encoder_runs(paged_held=400), "a GPU", 6000))[
        "paged arena: held ≤ 0.5x and P99 ≤ 1.0x the caching allocator's"].met == "yes"


def test_an_oom_of_the_paged_arena_misses_its_target(gpu_allocator):
    assert targets(gpu_allocator.summarize(encoder_runs(paged_ooms=1), "a GPU", 6000))[
        "paged arena: 0 OOMs under the cap (caching and expandable alongside)"].met == "no"


def test_the_capped_runs_have_a_table_of_their_own(gpu_allocator):
    tables = gpu_allocator.summarize(encoder_runs(), "a GPU", 6000)["tables"]
    capped = next(t for t in tables if "under a cap" in t.caption)
    assert capped.caption.startswith("encoder under a cap of 396 MiB (1.10x the caching allocator's peak live)")
    assert [row[:2] for row in capped.rows] == [["caching", "2"], ["expandable", "0"], ["arena", "9"],
                                                 ["arena_paged", "0"]]


def test_a_paged_arena_slower_at_p99_names_its_map_and_unmap_calls(gpu_allocator):
    slower = targets(gpu_allocator.summarize(encoder_runs(paged_held=400, paged_p99=1.02), "a GPU", 6000))[
        "paged arena: held ≤ 0.5x and P99 ≤ 1.0x the caching allocator's"]
    assert (slower.met, slower.measured) == ("no", "encoder 0.40x / 1.02x")
    assert "encoder 1,695 map and 31 unmap calls in 6,000 steps" in slower.why
    assert "up to half the pages in use" not in slower.why


def test_a_ratio_that_two_digits_would_round_to_one_shows_the_third(gpu_allocator):
    found = targets(gpu_allocator.summarize(encoder_runs(arena_p99=1.002), "a GPU", 6000))
    p99 = found["P99 per step ≤ 1.0x the caching allocator's"]
    assert (p99.met, p99.measured) == ("no", "encoder 1.002x")
    assert gpu_allocator.against(0.996) == "0.996x"
    assert gpu_allocator.against(1.0) == "1.00x"
    assert gpu_allocator.against(1.03) == "1.03x"
    assert gpu_allocator.against(0.504, 0.5) == "0.504x"
    assert gpu_allocator.against(0.5, 0.5) == "0.50x"
