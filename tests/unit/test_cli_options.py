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


@pytest.mark.parametrize("command", ["tune", "verify"])
def test_a_length_distribution_is_parsed_up_front_and_excludes_a_fixed_length(command, capsys):
    _, args = parse_command_line([command, "repo", "--model", "m", "--lengths", "lognormal:median=16,sigma=0.8"])
    assert (args.lengths.kind, dict(args.lengths.params)) == ("lognormal", {"median": "16", "sigma": "0.8"})
    _, args = parse_command_line([command, "repo", "--model", "m"])
    assert args.lengths is None and args.length == 16
    with pytest.raises(SystemExit):
        parse_command_line([command, "repo", "--model", "m", "--lengths", "gaussian:mean=3"])
    assert "unknown length distribution 'gaussian'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_command_line([command, "repo", "--model", "m", "--length", "8", "--lengths", "uniform:low=1,high=9"])
    assert "not allowed with argument" in capsys.readouterr().err
