import time

from latte.bench.budget import another_round_fits


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
