"""README.md's command lines, as a newcomer types them: every `latte ...` line parses, and the
ones that finish in seconds run as printed, in order, in a fresh folder."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LATTE = Path(sys.executable).parent / "latte"

# Lines that start a server or a long measurement: parsed here, run by the tests that serve.
LONG_RUNNING = ("serve", "bench", "demo", "tune", "tritonserver", "perf-analyzer")


def readme_commands() -> list:
    """Each `latte ...` line of README.md's code blocks, its trailing comment removed."""
    lines, fenced = [], False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced and line.startswith("latte "):
            lines.append(re.split(r"\s+#\s", line, maxsplit=1)[0].strip())
    return lines


def test_readme_shows_the_commands_it_promises():
    commands = {shlex.split(line)[1] for line in readme_commands()}
    assert {"examples", "serve", "generate", "validate", "profile", "bench", "deploy", "--help"} <= commands


@pytest.mark.parametrize("line", readme_commands())
def test_every_readme_latte_line_parses(line):
    from latte.cli import parse_command_line
    from latte.commands.passthrough import PASS_THROUGH

    argv = shlex.split(line)[1:]
    if argv[0] in PASS_THROUGH or argv == ["--help"]:
        return  # the program's own flags, or argparse's help: run below
    parser, args = parse_command_line(argv)  # exits (SystemExit) on a flag or argument that is wrong
    assert args.command == argv[0]


def test_the_quick_readme_lines_run_as_printed(tmp_path):
    ran = []
    for line in readme_commands():
        argv = shlex.split(line)
        if argv[1] in LONG_RUNNING:
            continue
        if "/opt/tritonserver" in line and not Path("/opt/tritonserver").exists():
            continue  # README's lines for an existing Triton install (an NGC container) need one
        done = subprocess.run([str(LATTE), *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        if argv[1] == "profile" and done.returncode == 1:
            # A measurement: on a loaded machine the SLO may truly not hold, which it must say in one line.
            assert "latte profile: error: the SLO of 20 ms cannot hold" in done.stderr, done.stderr
        else:
            assert done.returncode == 0, f"`{line}` failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        ran.append(argv[1])
    # What the run left behind is what the lines promise.
    assert (tmp_path / "repo" / "sequence_onnx" / "1" / "model.onnx").exists()
    assert (tmp_path / "pipeline-repo").is_dir() and any((tmp_path / "pipeline-repo").iterdir())
    assert list((tmp_path / "manifests").glob("*.yaml"))
    assert {"examples", "generate", "validate", "profile", "deploy", "install-backend", "--help"} <= set(ran)


@pytest.mark.parametrize("program", ["tritonserver", "perf-analyzer"])
def test_the_pass_through_programs_run(program):
    done = subprocess.run([str(LATTE), program, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() or done.stderr.strip()
