"""Runs the scheduler's C++ test executables, so `make test` (and CI) covers them.

The deterministic core tests and the multi-threaded stress test run in a Debug build with
invariants re-checked; the stress test runs again under ThreadSanitizer (`make tsan`).
Both builds live under build/ and are incremental after the first run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _make(target: str) -> subprocess.CompletedProcess:
    # The cmake that built the package may live in the virtual environment only.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if shutil.which("cmake", path=path) is None:
        pytest.fail("cmake is needed to build the C++ scheduler tests (apt-get install cmake)")
    return subprocess.run(
        ["nice", "make", "-s", "-C", str(REPO), target],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PATH": path},
    )


def _check(result: subprocess.CompletedProcess) -> str:
    output = result.stdout + result.stderr
    if result.returncode != 0:
        pytest.fail(f"exit status {result.returncode}\n{output[-6000:]}")
    return output


def test_scheduler_core_and_stress_tests_pass():
    output = _check(_make("test-scheduling-cpp"))
    assert "FAIL" not in output
    # Both executables ran: the core suite and the stress suite each print their tally.
    assert len(re.findall(r"^\d+ tests, 0 skipped, 0 failed checks$", output, re.MULTILINE)) == 2
    assert "every request is answered exactly once when shut down mid-traffic" in output


def test_stress_test_is_clean_under_thread_sanitizer():
    output = _check(_make("tsan"))
    assert "WARNING: ThreadSanitizer" not in output
    assert re.search(r"^2 tests, 0 skipped, 0 failed checks$", output, re.MULTILINE)
