"""The Jinja2 environment over the bundled templates, or a user's own folder."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import jinja2

BUNDLED = Path(__file__).resolve().parent.parent / "model_repository_templates"


class TemplateError(ValueError):
    """A template is missing, malformed, or refers to a value the context lacks."""


def bundled_templates() -> Path:
    # Installed: latte/model_repository_templates; a checkout has the same folder one level up.
    if BUNDLED.is_dir():
        return BUNDLED
    raise TemplateError(f"latte's bundled templates are missing (looked in {BUNDLED})")


def environment(folder: Optional[Path] = None) -> jinja2.Environment:
    """StrictUndefined: a misspelt key fails the render instead of writing an empty value."""
    search = [str(folder)] if folder else []
    search.append(str(bundled_templates()))
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(search),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(template: str, context: dict, folder: Optional[Path] = None) -> str:
    try:
        return environment(folder).get_template(template).render(**context).strip() + "\n"
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"{exc.filename or template}:{exc.lineno}: template syntax error: {exc.message}") from None
    except jinja2.TemplateNotFound as exc:
        raise TemplateError(f"template {exc.name!r} not found in {folder or bundled_templates()}") from None
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"{template}: {exc.message} (missing from the model's context)") from None
