"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest


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
