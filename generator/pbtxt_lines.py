"""The line of every field in a config.pbtxt, and its key paths as text, for file:line: field reports.

protobuf's Python text_format parser keeps no positions once it has parsed, so this walks
the text a second time, guided by the message's descriptor. It only runs on text that
text_format has already accepted, so it need not report syntax errors itself.

Key paths name fields by their protobuf names: a repeated message entry by its index and,
when it has one, by its `name` (("input", "tokens")); a map entry by its key
(("parameters", "model_file")), with the fields of the entry's value directly under it
(("model_warmup", "sample", "inputs", "tokens", "input_data_file")).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Tuple

KeyPath = Tuple[Any, ...]

_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<word>[A-Za-z0-9_.+\-]+)
  | (?P<mark>[{}\[\]<>:,;])
""", re.VERBOSE)

_CLOSE = {"{": "}", "<": ">"}


def _repeated(field) -> bool:
    """Whether a descriptor's field is repeated: `is_repeated` from protobuf 6.31 on (7 drops
    `label`), `label` before it."""
    if field is None:
        return False
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return field.label == field.LABEL_REPEATED


def _tokens(text: str) -> List[Tuple[str, int]]:
    tokens, line, pos = [], 1, 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:      # e.g. an extension name in brackets: nothing latte locates
            pos += 1
            continue
        if match.lastgroup != "space":
            tokens.append((match.group(), line))
        line += match.group().count("\n")
        pos = match.end()
    return tokens


def _unquote(token: str) -> str:
    return token[1:-1] if token[:1] in "\"'" else token


class _Walker:
    def __init__(self, tokens: List[Tuple[str, int]]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.lines: Dict[KeyPath, int] = {}

    def peek(self) -> str:
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else ""

    def take(self) -> Tuple[str, int]:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def message(self, path: KeyPath, descriptor, close: str) -> Dict[str, Tuple[str, int]]:
        """Walk fields up to `close`; returns this message's first scalar per field, with its line."""
        scalars: Dict[str, Tuple[str, int]] = {}
        counts: Dict[str, int] = {}
        while self.pos < len(self.tokens) and self.peek() != close:
            name, line = self.take()
            field = descriptor.fields_by_name.get(name) if descriptor is not None else None
            self.lines.setdefault(path + (name,), line)
            if self.peek() == ":":
                self.take()
            if self.peek() == "[":
                self.take()
                while self.pos < len(self.tokens) and self.peek() != "]":
                    self.value(path, name, line, field, counts, scalars)
                    if self.peek() == ",":
                        self.take()
                self.take()
            else:
                self.value(path, name, line, field, counts, scalars)
            if self.peek() in (",", ";"):
                self.take()
        if self.pos < len(self.tokens):
            self.take()
        return scalars

    def value(self, path, name, line, field, counts, scalars) -> None:
        if self.peek() not in _CLOSE:
            text, value_line = self.take()
            while self.peek()[:1] in "\"'" and self.peek():     # adjacent strings concatenate
                self.take()
            scalars.setdefault(name, (_unquote(text), value_line))
            return
        close = _CLOSE[self.take()[0]]
        nested = field.message_type if field is not None else None
        repeated = _repeated(field)
        here = path + (name,)
        if repeated:
            here = path + (name, counts.get(name, 0))
            counts[name] = counts.get(name, 0) + 1
        self.lines[here] = line
        inner = self.message(here, nested, close)
        is_map = nested is not None and nested.GetOptions().map_entry
        label = inner.get("key") if is_map else inner.get("name") if repeated else None
        if label is not None:
            labelled = path + (name, label[0])
            self.lines.setdefault(labelled, label[1])
            # Fields inside the entry are reachable through its label too; a map entry's value
            # fields directly, as in model_warmup['sample'].inputs['tokens'].input_data_file.
            inside = here + ("value",) if is_map else here
            for key, key_line in list(self.lines.items()):
                if key[:len(inside)] == inside and len(key) > len(inside):
                    self.lines.setdefault(labelled + key[len(inside):], key_line)


def field_lines(text: str, descriptor) -> Dict[KeyPath, int]:
    """Map each key path found in `text` (a `descriptor` message in text format) to its line."""
    walker = _Walker(_tokens(text))
    walker.message((), descriptor, close="")
    return walker.lines


def nearest_line(lines: Dict[KeyPath, int], path: KeyPath) -> int:
    """The line of `path`, or of its nearest enclosing field that is in the text; 1 if none is."""
    path = tuple(path)
    while path and path not in lines:
        path = path[:-1]
    return lines.get(path, 1)


def format_field_path(path: KeyPath, descriptor) -> str:
    """A key path as the fields read, e.g. ensemble_scheduling.step[1].input_map['x'] (a `descriptor` message)."""
    text, field = "", None
    for part in path:
        if _repeated(field):
            text += f"[{part}]" if isinstance(part, int) else f"[{part!r}]"
            descriptor, field = field.message_type, None
            if descriptor is not None and descriptor.GetOptions().map_entry and isinstance(part, str):
                # A map entry named by its key: what follows are the value's fields.
                descriptor = descriptor.fields_by_name["value"].message_type
            continue
        if field is not None:
            descriptor = field.message_type
        field = descriptor.fields_by_name.get(part) if descriptor is not None else None
        if field is None:
            descriptor = None
        text += f".{part}" if text else str(part)
    return text
