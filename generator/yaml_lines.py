"""YAML that remembers where every value came from, so errors can name file:line and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Tuple

import yaml

KeyPath = Tuple[Any, ...]


class SpecError(ValueError):
    """A pipeline spec that cannot be generated; the message starts with file:line: key."""


class Located:
    """Plain Python values loaded from YAML plus the line of each key path."""

    def __init__(self, source: str, value: Any, lines: Dict[KeyPath, int]) -> None:
        self.source = source
        self.value = value
        self.lines = lines

    def line(self, path: KeyPath) -> int:
        # The nearest enclosing key that has a line: a missing key is reported at its parent.
        while path not in self.lines and path:
            path = path[:-1]
        return self.lines.get(path, 1)

    def where(self, path: KeyPath) -> str:
        return f"{self.source}:{self.line(path)}: {format_path(path)}"

    def error(self, path: KeyPath, message: str) -> SpecError:
        return SpecError(f"{self.where(path)}: {message}")


def format_path(path: KeyPath) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _convert(node: yaml.Node, path: KeyPath, lines: Dict[KeyPath, int], source: str) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            key = yaml.safe_load(yaml.serialize(key_node))
            if key in out:
                raise SpecError(f"{source}:{key_node.start_mark.line + 1}: {format_path(path + (key,))}: "
                                "duplicate key")
            out[key] = _convert(value_node, path + (key,), lines, source)
            lines[path + (key,)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, path + (i,), lines, source) for i, item in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))


def load(path: Path) -> Located:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"{path}: the spec file does not exist") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise SpecError(f"{path}:{line}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    lines: Dict[KeyPath, int] = {}
    value = _convert(node, (), lines, str(path)) if node is not None else {}
    return Located(str(path), value, lines)
