"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def example_repo(tmp_path_factory) -> Path:
    """The bundled example repository, built once per test run (6 models, ~5 s)."""
    from latte.examples import build_examples

    return build_examples(tmp_path_factory.mktemp("examples") / "repository")
