"""Options the CLI refuses up front, with the reason, instead of a run that cannot succeed."""

import pytest

from latte.cli import parse_command_line


def test_bench_refuses_fewer_trials_than_perf_analyzer_needs_to_settle(capsys):
    with pytest.raises(SystemExit):
        parse_command_line(["bench", "repo", "--model", "m", "--max-trials", "2"])
    err = capsys.readouterr().err
    assert "--max-trials" in err and "must be >= 3" in err
    _, args = parse_command_line(["bench", "repo", "--model", "m", "--max-trials", "3"])
    assert args.max_trials == 3
