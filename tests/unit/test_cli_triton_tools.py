"""Triton's own programs as a user types them: `latte tritonserver`, `latte perf-analyzer`,
`.venv/bin/perf_analyzer`, and tritonserver flags after `latte serve ... --`."""

import subprocess
import sys
from pathlib import Path

import pytest

from latte.cli import parse_command_line

LATTE = [sys.executable, "-m", "latte.cli"]


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_latte_tritonserver_help_shows_the_servers_own_flags_and_succeeds(flag):
    done = subprocess.run(LATTE + ["tritonserver", flag], capture_output=True, text=True, timeout=60)
    # tritonserver's own usage text, which names flags latte does not have.
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--model-control-mode" in done.stdout
    assert "error while loading shared libraries" not in done.stderr


def test_latte_tritonserver_points_at_latte_backends_unless_told_otherwise():
    from latte.commands.passthrough import tritonserver_command

    command = tritonserver_command(["--model-repository=/models"])
    assert Path(command[0]).name == "tritonserver"
    assert any(arg.startswith("--backend-directory=") and arg.endswith("backends") for arg in command)
    assert command[-1] == "--model-repository=/models"
    mine = tritonserver_command(["--backend-directory=/opt/b", "--model-repository=/models"])
    assert [arg for arg in mine if arg.startswith("--backend-directory")] == ["--backend-directory=/opt/b"]


@pytest.mark.perf_analyzer_2_51
@pytest.mark.parametrize("command", [LATTE + ["perf-analyzer", "--help"], [str(Path(sys.executable).parent / "perf_analyzer"), "--help"]])
def test_perf_analyzer_runs_as_typed(command):
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    output = done.stdout + done.stderr
    assert "error while loading shared libraries" not in output
    assert "--concurrency-range" in output


@pytest.mark.perf_analyzer_2_51
def test_latte_perf_analyzer_help_succeeds_without_the_programs_complaint():
    done = subprocess.run(LATTE + ["perf-analyzer", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--concurrency-range" in done.stdout and "unrecognized option" not in done.stdout


def test_flags_after_a_double_dash_go_to_tritonserver():
    _, args = parse_command_line(["serve", "repo", "--http-port", "9000", "--", "--log-verbose=1", "--model-control-mode=explicit"])
    assert args.repo == "repo" and args.http_port == 9000
    assert args.passthrough == ["--log-verbose=1", "--model-control-mode=explicit"]


def test_a_command_that_starts_no_program_refuses_flags_after_a_double_dash(capsys):
    with pytest.raises(SystemExit):
        parse_command_line(["validate", "repo", "--", "--log-verbose=1"])
    assert "takes no arguments after `--`" in capsys.readouterr().err


def test_help_shows_defaults():
    out = subprocess.run(LATTE + ["serve", "--help"], capture_output=True, text=True, check=True).stdout
    assert "(default: 8000)" in out and "(default: 8001)" in out
    assert "-- TRITONSERVER_FLAGS" in out
