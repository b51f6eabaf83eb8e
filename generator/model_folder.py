"""Writing model folders: the config.pbtxt of a model, and the files of its version folder."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Mapping, Optional

from latte.generator.templates import render
from latte.generator.validate import parse_config


def render_model_config(context: Mapping, templates: Optional[Path] = None) -> str:
    """Render config.pbtxt for one model and check that it parses as Triton's ModelConfig."""
    ctx = {"platform": None, "dynamic_batching": None, **context}
    text = render("config.pbtxt.j2", ctx, templates)
    parse_config(text, f"{ctx['name']}/config.pbtxt")
    return text


def _copy(source: Path, target: Path) -> None:
    """A model file, or a folder (a streaming model's step folders), into a version folder."""
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        shutil.copy2(source, target)


def _fresh_model_dir(repo: Path, name: str, versions) -> Path:
    # A file left from an earlier write (another model file, old warm-up data) would be served too.
    model_dir = Path(repo) / name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    for version in versions:
        (model_dir / str(version)).mkdir(parents=True)
    return model_dir


def write_model(repo: Path, context: Mapping, files: Mapping[str, Path], version: int = 1,
                templates: Optional[Path] = None, warmup_files: Optional[Mapping[str, bytes]] = None,
                versions: Optional[Mapping[int, Mapping[str, Path]]] = None) -> Path:
    """Write REPO/<name>/config.pbtxt, copy `files` into REPO/<name>/<version>/ (or each
    version's files of `versions`, {version: files}, into its own folder) and `warmup_files`
    (the raw data model_warmup entries name) into REPO/<name>/warmup/."""
    text = render_model_config(context, templates)
    by_version = dict(versions) if versions else {version: files}
    model_dir = _fresh_model_dir(repo, context["name"], by_version)
    (model_dir / "config.pbtxt").write_text(text)
    for number, version_files in by_version.items():
        for name, source in version_files.items():
            _copy(Path(source), model_dir / str(number) / name)
    if warmup_files:
        (model_dir / "warmup").mkdir()
        for name, data in warmup_files.items():
            (model_dir / "warmup" / name).write_bytes(data)
    return model_dir


def write_ensemble(repo: Path, context: Mapping, templates: Optional[Path] = None) -> Path:
    """Write REPO/<name>/config.pbtxt of an ensemble; its version folder stays empty, as Triton
    wants one even for an ensemble."""
    text = render("ensemble.pbtxt.j2", dict(context), templates)
    parse_config(text, f"{context['name']}/config.pbtxt")
    model_dir = _fresh_model_dir(repo, context["name"], (1,))
    (model_dir / "config.pbtxt").write_text(text)
    return model_dir
