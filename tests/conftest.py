"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

# The property tests (tests/unit/memory) draw the same examples on every run by default, so a
# run fails only where the code changed, never by the draw: each test's examples come from a
# hash of the test itself, and no example saved by an earlier run is replayed.
hypothesis_settings.register_profile("fixed", derandomize=True, database=None)
# To explore beyond those examples, select a random draw:
#   LATTE_HYPOTHESIS_PROFILE=explore .venv/bin/python -m pytest tests/unit/memory
# A failure it finds is printed with the example that failed (and @reproduce_failure's line).
hypothesis_settings.register_profile("explore", derandomize=False, print_blob=True)
hypothesis_settings.load_profile(os.environ.get("LATTE_HYPOTHESIS_PROFILE", "fixed"))


@pytest.fixture(scope="session")
def example_repo(tmp_path_factory) -> Path:
    """The bundled example repository, built once per test run (6 models, ~5 s)."""
    from latte.examples import build_examples

    return build_examples(tmp_path_factory.mktemp("examples") / "repository")


@pytest.fixture(scope="session", autouse=True)
def machine_calibration_cache(tmp_path_factory):
    """One serving-cost calibration per test run, kept apart from the user's own
    (~/.cache/latte): the tests that calibrate share it, as commands on one machine do."""
    import os

    previous = os.environ.get("LATTE_CACHE_DIR")
    os.environ["LATTE_CACHE_DIR"] = str(tmp_path_factory.mktemp("latte-cache"))
    yield
    if previous is None:
        os.environ.pop("LATTE_CACHE_DIR", None)
    else:
        os.environ["LATTE_CACHE_DIR"] = previous
