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


def write_model(repo: Path, context: Mapping, files: Mapping[str, Path], version: int = 1,
                templates: Optional[Path] = None) -> Path:
    """Write REPO/<name>/config.pbtxt and copy `files` into REPO/<name>/<version>/."""
    model_dir = Path(repo) / context["name"]
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(render_model_config(context, templates))
    for name, source in files.items():
        shutil.copy2(source, version_dir / name)
    return model_dir
