"""`latte tune`'s search: neighbours one setting away, applied to real configs, and when it stops."""

from latte.generator.tune import Budget, Candidate, Measurement, TuneError, TuneResult, neighbours, pick_next, search
from latte.generator.validate import parse_config

CONFIG = """
name: "enc" backend: "latte" max_batch_size: 16
input { name: "tokens" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true }
output { name: "embedding" data_type: TYPE_FP32 dims: [ 32 ] }
dynamic_batching { max_queue_delay_microseconds: 0 preferred_batch_size: [ 8 ]
                   default_queue_policy { max_queue_size: 24 default_timeout_microseconds: 9000 } }
instance_group { count: 2 kind: KIND_CPU }
parameters { key: "intra_op_threads" value: { string_value: "1" } }
"""


def test_candidate_reads_and_rewrites_a_config():
    config = parse_config(CONFIG)
    start = Candidate.of(config)
    assert start == Candidate(instances=2, max_batch_size=16, delay_us=0, preferred=(8,), queue_policy=True)
    changed = Candidate(instances=3, max_batch_size=4, delay_us=500, preferred=(8,), queue_policy=False).apply(config)
    assert (changed.max_batch_size, changed.instance_group[0].count) == (4, 3)
    assert changed.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(changed.dynamic_batching.preferred_batch_size) == []     # 8 > max_batch_size 4
    assert not changed.dynamic_batching.HasField("default_queue_policy")
    assert changed.parameters["intra_op_threads"].string_value == "1"    # untouched settings stay
    assert config.max_batch_size == 16                                    # the original is not modified


def test_neighbours_change_one_setting_including_those_model_analyzer_never_searches():
    start = Candidate(instances=2, max_batch_size=16, delay_us=0, preferred=(8,), queue_policy=True)
    found = neighbours(start, slo_ms=40, max_instances=2)
    # One instance goes without the queue policy, which would stall it (Triton 2.51).
    assert Candidate(1, 16, 0, (8,), False) in found and Candidate(1, 16, 0, (8,), True) not in found
    assert Candidate(3, 16, 0, (8,), True) not in found
    assert Candidate(2, 32, 0, (8,), True) in found and Candidate(2, 8, 0, (8,), True) in found
    assert Candidate(2, 16, 2000, (8,), True) in found and Candidate(2, 16, 5000, (8,), True) in found
    assert Candidate(2, 16, 0, (), True) in found
    assert Candidate(2, 16, 0, (8,), False) in found
    assert all(sum(a != b for a, b in zip(vars(c).values(), vars(start).values())) == 1
               for c in found if c.instances == start.instances)


def test_one_instance_never_gets_a_queue_policy_back():
    alone = Candidate(instances=1, max_batch_size=16, delay_us=0, preferred=(), queue_policy=False)
    found = neighbours(alone, slo_ms=40, max_instances=2)
    assert all(not c.queue_policy for c in found if c.instances == 1)
    assert Candidate(2, 16, 0, (), False) in found


def test_neighbours_trade_instances_for_batch_size_where_model_analyzer_searches():
    start = Candidate(instances=2, max_batch_size=64, delay_us=0, preferred=(32,), queue_policy=False)
    found = neighbours(start, slo_ms=30, max_instances=4, policy_available=False)
    assert Candidate(3, 32, 0, (32,), False) in found     # more instances, each batching half as much
    assert Candidate(1, 128, 0, (32,), False) in found
    assert Candidate(3, 64, 0, (32,), False) in found and Candidate(2, 32, 0, (32,), False) in found


def test_a_config_without_a_queue_policy_is_never_offered_one():
    # "policy" would apply the very same config: two measurements of one config, ranked as two.
    start = Candidate(instances=2, max_batch_size=64, delay_us=0, preferred=(), queue_policy=False)
    assert all(not c.queue_policy for c in neighbours(start, slo_ms=30, max_instances=4, policy_available=False))
    assert any(c.queue_policy for c in neighbours(start, slo_ms=30, max_instances=4, policy_available=True))


def test_a_neighbour_that_wins_only_once_is_not_moved_to():
    start = Candidate(2, 16, 0, (), False)
    lucky = Candidate(2, 32, 0, (), False)
    times = {}

    def noisy(candidate):  # `lucky` measures 130 the first time, 95 after: a noise spike
        times[candidate] = times.get(candidate, 0) + 1
        score = 130.0 if candidate == lucky and times[candidate] == 1 else (95.0 if candidate == lucky else 100.0)
        return Measurement(candidate, score=score, p99_ms=5.0, concurrency=8)

    first, best, measured = search(start, noisy, slo_ms=20, max_instances=2)
    assert best.candidate == start
    again = {m.candidate: m for m in measured}
    assert again[lucky].scores == [130.0, 95.0] and again[lucky].score == 112.5
    assert times[start] == 2 and len(first.scores) == 2     # the incumbent was measured again beside it


def test_a_neighbour_that_wins_again_is_moved_to():
    start = Candidate(2, 16, 0, (), False)
    better = Candidate(2, 32, 0, (), False)
    _, best, _ = search(start, scores({better: 150.0}), slo_ms=20, max_instances=2)
    assert best.candidate == better and best.scores == [150.0, 150.0]


def test_an_incumbent_that_misses_when_measured_again_does_not_stay_the_winner():
    start = Candidate(2, 64, 0, (), False)
    first_pick = Candidate(2, 32, 0, (), False)
    holds = Candidate(2, 128, 0, (), False)
    challenger = Candidate(2, 32, 5000, (), False)
    times = {}

    def measure(candidate):  # at the planned rate first_pick and challenger hold once, then miss
        times[candidate] = times.get(candidate, 0) + 1
        score = {first_pick: 2000.0, holds: 1900.0, challenger: 2200.0}.get(candidate, 1500.0)
        poisson = 120.0 if candidate == start else 90.0
        if candidate in (first_pick, challenger) and times[candidate] > 1:
            poisson = 600.0
        return Measurement(candidate, score=score, p99_ms=80.0, concurrency=64, poisson_p99_ms=poisson)

    _, best, _ = search(start, measure, slo_ms=100, max_instances=2)
    assert times[first_pick] == 2 and times[challenger] == 2 and best.candidate == holds


def scores(table):
    """A measure function from a table of candidate -> infer/s (P99 always within the SLO)."""
    def measure(candidate):
        return Measurement(candidate, score=table.get(candidate, 100.0), p99_ms=5.0, concurrency=4)
    return measure


def timed(table, now, seconds=30.0):
    """scores(table), each measurement taking `seconds` on the clock now[0]."""
    def measure(candidate):
        now[0] += seconds
        return scores(table)(candidate)
    return measure


def test_a_budget_starts_no_measurement_that_would_end_past_it_and_moves_on_no_unconfirmed_win():
    start, better = Candidate(2, 16, 0, (), False), Candidate(2, 16, 2500, (), False)
    now = [0.0]
    budget = Budget(100.0, clock=lambda: now[0])
    first, best, measured = search(start, timed({better: 150.0}, now), slo_ms=20, max_instances=2, budget=budget)
    # 30 s each: start, then the two delays at 30 and 60 s (better second); one at 90 s would end at 120
    assert budget.ran_out and [m.candidate for m in measured] == [start, Candidate(2, 16, 1000, (), False), better]
    # better won once, but measuring the pair again would end past the budget: no move
    assert best.candidate == start and first.scores == []


def test_a_budget_keeps_room_to_confirm_a_win_instead_of_measuring_more_neighbours():
    start, better = Candidate(2, 16, 0, (), False), Candidate(2, 16, 2500, (), False)
    now = [0.0]
    budget = Budget(160.0, clock=lambda: now[0])
    first, best, measured = search(start, timed({better: 150.0}, now), slo_ms=20, max_instances=2, budget=budget)
    # better wins at 90 s; another neighbour then the pair would end at 180 s: the pair goes first
    assert len(measured) == 3 and best.candidate == better and best.scores == [150.0, 150.0]
    assert first.scores == [100.0, 100.0] and now[0] == 150.0 and budget.ran_out


def test_a_budget_too_short_for_the_whole_neighbourhood_confirms_a_win_at_once():
    start, delay = Candidate(2, 16, 0, (), False), Candidate(2, 16, 1000, (), False)   # delay: the first neighbour
    now, order = [0.0], []
    budget = Budget(80.0, clock=lambda: now[0])

    def measure(candidate):
        order.append(candidate)
        now[0] += 10.0
        return scores({delay: 150.0})(candidate)

    first, best, _ = search(start, measure, slo_ms=20, max_instances=2, budget=budget)
    # At 20 s the rest of start's neighbours and a pair would end past 80 s: the pair comes next.
    assert order[:4] == [start, delay, start, delay]
    assert best.candidate == delay and best.scores == [150.0, 150.0] and first.scores == [100.0, 100.0]
    # With room for the whole neighbourhood, every neighbour is measured before the pair.
    order.clear()
    search(start, measure, slo_ms=20, max_instances=2)
    count = len(neighbours(start, 20, 2, policy_available=False))   # start has no queue policy
    assert count > 3 and len(set(order[:1 + count])) == 1 + count and order[1 + count] == start


def test_a_budget_expects_each_measurement_to_take_as_long_as_the_longest_after_the_first():
    now = [0.0]
    budget = Budget(100.0, clock=lambda: now[0])

    def taking(seconds):
        return lambda candidate: now.__setitem__(0, now[0] + seconds) or Measurement(candidate)
    budget.timed(taking(40.0), Candidate(2, 16, 0, (), False))   # the start: the only guess so far
    assert budget.fits(1) and not budget.fits(2) and not budget.ran_out
    budget.timed(taking(10.0), Candidate(2, 32, 0, (), False))   # 50 s gone, neighbours take 10 s
    assert budget.fits(5) and not budget.fits(6)
    assert not budget.allows(6) and budget.ran_out


def test_a_budget_with_room_changes_nothing():
    start, better = Candidate(2, 16, 0, (), False), Candidate(2, 32, 0, (), False)
    now = [0.0]
    budget = Budget(1e6, clock=lambda: now[0])
    _, best, measured = search(start, timed({better: 150.0}, now), slo_ms=20, max_instances=2, budget=budget)
    _, unbudgeted, everything = search(start, scores({better: 150.0}), slo_ms=20, max_instances=2)
    assert not budget.ran_out and best.candidate == unbudgeted.candidate == better
    assert len(measured) == len(everything)


def test_a_budget_must_be_positive_and_a_spent_one_is_said_in_the_table():
    import pytest

    with pytest.raises(TuneError, match="the time budget must be more than 0 s, got 0"):
        Budget(0)
    start = Measurement(Candidate(2, 16, 0, (), False), score=100.0, p99_ms=5.0, concurrency=4)
    result = TuneResult("enc", 20.0, start, start, [start], wall_s=130.0, budget_s=100.0, out_of_budget=True)
    assert "enc: stopped when its 100 s budget was spent" in result.table()
    assert result.to_json()["out_of_budget"] is True


def test_search_climbs_while_a_neighbour_wins_by_more_than_three_percent():
    start = Candidate(1, 8, 0, (), True)
    two = Candidate(2, 8, 0, (), True)
    two_big = Candidate(2, 16, 0, (), True)
    first, best, measured = search(start, scores({two: 150.0, two_big: 200.0}), slo_ms=20, max_instances=2)
    assert first.candidate == start and best.candidate == two_big
    assert len({m.candidate for m in measured}) == len(measured)      # nothing measured twice


def test_search_stops_when_no_neighbour_beats_the_best_by_three_percent():
    start = Candidate(1, 8, 0, (), True)
    _, best, measured = search(start, scores({Candidate(2, 8, 0, (), True): 102.0}), slo_ms=20, max_instances=2)
    assert best.candidate == start
    assert len(measured) == 1 + len(neighbours(start, 20, 2))


def test_refused_or_slo_missing_candidates_never_win():
    best = Measurement(Candidate(1, 8, 0, (), True), score=100.0)
    refused = Measurement(Candidate(2, 8, 0, (), True), score=500.0, error="refused at load: too many threads")
    late = Measurement(Candidate(1, 16, 0, (), True), score=400.0, poisson_p99_ms=35.0)
    assert pick_next(best, [refused, late], slo_ms=20) is None


def test_tune_has_help_with_an_example(capsys):
    import pytest

    from latte.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["tune", "--help"])
    assert exit_info.value.code == 0
    assert "latte tune repo/ --model encoder" in capsys.readouterr().out


def test_tuning_a_model_the_repository_lacks_is_one_clear_line(tmp_path, capsys):
    from latte.cli import main
    from latte.generator.calibrate import write_calibration_repository

    repo = write_calibration_repository(tmp_path / "repo")
    assert main(["tune", str(repo), "--model", "encoder", "--slo-ms", "20"]) == 1
    err = capsys.readouterr().err
    assert "model 'encoder' is not in" in err and "identity_batched, identity_single" in err
    assert "Traceback" not in err


class FakePoint:
    def __init__(self, throughput, p99_ms):
        self.throughput, self.p99_ms = throughput, p99_ms


def test_closed_loop_scan_keeps_its_best_level_when_the_queue_overflows():
    from latte.generator.tune import _closed_loop
    from latte.triton.perf import PerfAnalyzerError

    curve = {2: FakePoint(100, 3.0), 4: FakePoint(180, 5.0), 8: FakePoint(175, 9.0), 12: None, 16: None}

    def run(concurrency):
        point = curve[concurrency[0]]
        if point is None:
            raise PerfAnalyzerError("perf_analyzer failed\nExceeds maximum queue size")
        return point

    score, p99, level, rows = _closed_loop(run, Candidate(2, 8, 0, (), True), slo_ms=20)
    # One doubling without gain (8) is noise; the rejection at 16 ends the scan, and 12, midway, is rejected too.
    assert (score, p99, level) == (180, 5.0, 4)
    assert rows[-2:] == [{"concurrency": c, "error": "Exceeds maximum queue size"} for c in (16, 12)]


def test_closed_loop_scan_stops_where_p99_passes_the_slo():
    from latte.generator.tune import _closed_loop

    curve = {2: FakePoint(100, 3.0), 3: FakePoint(150, 21.0), 4: FakePoint(180, 25.0)}
    score, _, level, rows = _closed_loop(lambda concurrency: curve[concurrency[0]], Candidate(2, 8, 0, (), True), 20)
    assert (score, level) == (100, 2) and [r["concurrency"] for r in rows] == [2, 4, 3]


def growing_curve():
    """A config whose throughput keeps growing past 32 in flight and whose P99 passes 100 ms at
    128: (perf_analyzer stand-in, the levels it was run at)."""
    curve = {2: 100, 4: 190, 8: 350, 16: 600, 24: 750, 32: 900, 64: 1200, 96: 1280, 128: 1300}
    p99 = {2: 5, 4: 6, 8: 8, 16: 15, 24: 22, 32: 30, 64: 60, 96: 95, 128: 140}
    seen = []

    def run(concurrency):
        seen.append(concurrency[0])
        return FakePoint(curve[concurrency[0]], p99[concurrency[0]])
    return run, seen


def test_closed_loop_scan_goes_past_a_fixed_range_until_the_slo_binds():
    from latte.generator.tune import closed_loop_scan

    run, seen = growing_curve()
    score, best_p99, level, rows = closed_loop_scan(run, slo_ms=100, first_level=2, last_level=512)
    # 128 misses the SLO right above 64: 96, midway, holds it and is the best
    assert (score, best_p99, level) == (1280, 95, 96)
    assert seen == [2, 4, 8, 16, 32, 64, 128, 96]
    assert closed_loop_scan(run, slo_ms=100, first_level=2, last_level=32)[:3] == (900, 30, 32)


def test_closed_loop_scan_from_a_neighbours_level_skips_the_levels_far_below_it():
    from latte.generator.tune import closed_loop_scan

    run, seen = growing_curve()
    assert closed_loop_scan(run, slo_ms=100, first_level=2, last_level=512, start_level=32)[:3] == (1280, 95, 96)
    assert seen == [32, 64, 128, 96]
    # Started above where this config binds, it halves until a level holds the SLO: that level is its best.
    seen.clear()
    assert closed_loop_scan(run, slo_ms=20, first_level=2, last_level=512, start_level=64)[:3] == (600, 15, 16)
    assert seen == [64, 32, 16, 24]     # 24, midway to the first miss, misses too
    # No level holds it: no score, as from the first level.
    seen.clear()
    assert closed_loop_scan(run, slo_ms=4, first_level=2, last_level=512, start_level=8)[0] == 0.0
    assert seen == [8, 4, 2]


def test_a_measurement_waits_for_the_previous_configs_instances_to_exit():
    from latte.generator.tune import settle

    running = iter([4, 4, 3, 2])   # the new config's 2 instances beside the old config's 2, exiting
    slept = []
    assert settle(lambda: next(running), instances=2, sleep=slept.append)
    assert len(slept) == 3


def test_a_measurement_gives_up_waiting_for_instances_that_do_not_exit():
    from latte.generator.tune import settle

    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    assert not settle(lambda: 3, instances=1, timeout_s=1.0, sleep=sleep, clock=lambda: now[0])
    assert now[0] >= 1.0


def test_when_no_candidate_holds_the_planned_rate_the_search_ranks_by_closed_loop_throughput():
    start = Candidate(2, 64, 0, (32,), True)
    faster = Candidate(2, 64, 5000, (32,), True)
    table = {faster: 1560.0}
    lines = []

    def overloaded(candidate):  # every candidate is rejected at the plan's (too high) rate
        return Measurement(candidate, score=table.get(candidate, 1146.0), p99_ms=80.0, concurrency=32,
                           poisson_p99_ms=float("inf"))

    first, best, measured = search(start, overloaded, slo_ms=100, max_instances=4, log=lines.append)
    assert best.candidate == faster and first.candidate == start
    assert any("no candidate holds the planned rate" in line for line in lines)


def test_where_one_candidate_holds_the_planned_rate_only_those_that_hold_it_can_win():
    start = Candidate(2, 16, 0, (), True)
    holds = Candidate(3, 16, 0, (), True)
    misses_but_fast = Candidate(2, 32, 0, (), True)

    def measure(candidate):
        score = {holds: 120.0, misses_but_fast: 300.0}.get(candidate, 100.0)
        return Measurement(candidate, score=score, p99_ms=10.0, concurrency=8,
                           poisson_p99_ms=15.0 if candidate == holds else 45.0)

    _, best, _ = search(start, measure, slo_ms=20, max_instances=4)
    assert best.candidate == holds
