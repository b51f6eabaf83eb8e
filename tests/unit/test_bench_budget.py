import time

from latte.bench.budget import another_round_fits, rounds_within


def test_one_more_round_runs_only_where_it_ends_within_the_budget():
    ten_seconds_ago = time.monotonic() - 10.0  # two rounds done: 5 s each, a third ends at ~15 s
    assert not another_round_fits(ten_seconds_ago, 2, budget_s=12.0)
    assert another_round_fits(ten_seconds_ago, 2, budget_s=20.0)
    assert another_round_fits(ten_seconds_ago, 0, budget_s=1.0)  # the first round always runs
    assert another_round_fits(ten_seconds_ago, 2, budget_s=0.0)  # no budget


def test_several_more_rounds_fit_only_where_all_of_them_end_within_the_budget():
    ten_seconds_ago = time.monotonic() - 10.0  # two rounds done: 5 s each
    assert another_round_fits(ten_seconds_ago, 2, budget_s=21.0, more=2)
    assert not another_round_fits(ten_seconds_ago, 2, budget_s=21.0, more=3)


def test_rounds_stop_before_one_that_would_pass_the_budget_and_say_so(monkeypatch):
    clock = iter([100.0, 104.0, 108.0])  # the start, then before rounds 1 and 2 (round 0 always runs)
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    said = []
    assert list(rounds_within(5, budget_s=11.0, unit="window", log=said.append)) == [0, 1]
    assert said == ["  stopping after 2 window(s): another would pass --budget-s 11"]


def test_without_a_budget_every_round_runs():
    said = []
    assert list(rounds_within(3, budget_s=0.0, log=said.append)) == [0, 1, 2] and said == []
